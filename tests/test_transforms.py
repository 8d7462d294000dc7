"""Every transform's own before/after examples, as tests.

For each example: T(before) == after byte for byte, T(T(before)) ==
T(before), the result compiles, and revert(T(before)) == before.
"""

from __future__ import annotations

import libcst as cst
import pytest

from patchcraft.engine import revert_text
from patchcraft.transforms import MODEL_TRANSFORMS, keep_captured_states_reduced

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
