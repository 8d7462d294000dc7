"""Every transform's own before/after examples, as tests.

For each example: T(before) == after byte for byte, T(T(before)) ==
T(before), the result compiles, and revert(T(before)) == before.
"""

from __future__ import annotations

import libcst as cst
import pytest

from patchcraft.engine.file_patch import revert_text
from patchcraft.transforms import MODEL_TRANSFORMS, keep_captured_states_reduced
from patchcraft.transforms._base import assign_targets, find_statements, walk_statements

#: The model transforms and the fusion transform (the runner's examples: tests/test_runner_transform.py).
CHECKED = (*MODEL_TRANSFORMS, keep_captured_states_reduced)
CASES = [
    pytest.param(t, ex, id=f"{t.NAME}/{i}-{ex.title[:40]}")
    for t in CHECKED
    for i, ex in enumerate(t.EXAMPLES)
]


def _apply(transform, code: str, site) -> str:
    module, _ = transform.apply(cst.parse_module(code), site)
    return module.code


@pytest.mark.parametrize("transform,example", CASES)
def test_example(transform, example) -> None:
    once = _apply(transform, example.before, example.site)
    assert once == example.after
    assert _apply(transform, once, example.site) == once
    compile(once, "example.py", "exec")
    if once != example.before:
        assert revert_text(once, example.site.path) == example.before


@pytest.mark.parametrize("transform", CHECKED, ids=lambda t: t.NAME)
def test_every_transform_is_documented(transform) -> None:
    assert transform.DESCRIPTION and transform.EXAMPLES
    assert any(ex.before != ex.after for ex in transform.EXAMPLES)


TRY_STAR = '''\
def __init__(self):
    try:
        pass
    except* ValueError:
        self.layers_to_capture = []
'''


def test_an_except_star_body_is_walked_like_an_except_body() -> None:
    """One statement walker serves every transform: a statement in an ``except*`` body is found."""
    func = cst.parse_module(TRY_STAR).body[0]
    assert isinstance(func, cst.FunctionDef)
    found = find_statements(func, lambda stmt: bool(assign_targets(stmt)))
    assert [cst.Module(body=()).code_for_node(stmt).strip() for stmt in found] == ["self.layers_to_capture = []"]
    assert found == [stmt for stmt, _ in walk_statements(func) if assign_targets(stmt)]
