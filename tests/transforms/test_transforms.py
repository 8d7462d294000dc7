"""Every transform has its examples, and its own test file runs them.

The examples themselves run in tests/transforms/test_<name>.py (one file
per transform: T(before) == after byte for byte, T(T(before)) ==
T(before), the result compiles, and revert(T(before)) == before); the
other files of this folder are named in :data:`OTHER_TESTS`.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from patchcraft.transforms import MODEL_TRANSFORMS, TREE_TRANSFORMS, VLLM_TRANSFORMS
from patchcraft.transforms._base import assign_targets, find_statements, walk_statements
from patchcraft.transforms.examples import BY_NAME as EXAMPLES

#: Every transform: the model transforms, the runner's, the fusion transform and vLLM's.
ALL = (*MODEL_TRANSFORMS, *TREE_TRANSFORMS, *VLLM_TRANSFORMS)
TESTS = Path(__file__).resolve().parent
#: The files of tests/transforms/ that are no one transform's: the package's helpers (``_definite_assignment``,
#: ``_slices``), this file, and the transforms on trees and real releases (shapes, forward rules, the runner).
OTHER_TESTS = {
    "test_definite_assignment",
    "test_slices",
    "test_transforms",
    "test_shapes",
    "test_forward_rules",
    "test_runner_transform",
}


def test_every_transform_has_one_examples_module_and_one_test_file() -> None:
    assert sorted(EXAMPLES) == sorted(t.NAME for t in ALL)
    assert all(EXAMPLES[t.NAME].TRANSFORM is t for t in ALL)
    assert sorted(p.stem for p in TESTS.glob("test_*.py") if p.stem not in OTHER_TESTS) == sorted(
        f"test_{t.NAME}" for t in ALL
    )


@pytest.mark.parametrize("transform", ALL, ids=lambda t: t.NAME)
def test_every_transform_is_documented(transform) -> None:
    examples = EXAMPLES[transform.NAME].EXAMPLES
    assert transform.DESCRIPTION and examples
    assert any(ex.before != ex.after for ex in examples)


TRY_STAR = """\
def __init__(self):
    try:
        pass
    except* ValueError:
        self.layers_to_capture = []
"""


def test_an_except_star_body_is_walked_like_an_except_body() -> None:
    """One statement walker serves every transform: a statement in an ``except*`` body is found."""
    func = cst.parse_module(TRY_STAR).body[0]
    assert isinstance(func, cst.FunctionDef)
    found = find_statements(func, lambda stmt: bool(assign_targets(stmt)))
    assert [cst.Module(body=()).code_for_node(stmt).strip() for stmt in found] == ["self.layers_to_capture = []"]
    assert found == [stmt for stmt, _ in walk_statements(func) if assign_targets(stmt)]
