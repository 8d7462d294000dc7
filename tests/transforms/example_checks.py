"""The one check every transform's examples get (tests/transforms/test_<name>.py).

For each example: T(before) == after byte for byte, T(T(before)) ==
T(before), the result compiles, and revert(T(before)) == before (also
for an unchanged example without a marker: revert leaves hand-made code alone).
"""

from __future__ import annotations

import libcst as cst
import pytest

from patchcraft import MARKER
from patchcraft.engine.file_patch import revert_text
from patchcraft.transforms._base import Example
from patchcraft.transforms._contract import Transform, TransformExamples


def cases(examples: TransformExamples) -> list:
    """One pytest param per example, named ``<index>-<title>``."""
    return [pytest.param(example, id=f"{i}-{example.title[:40]}") for i, example in enumerate(examples.EXAMPLES)]


def _apply(transform: Transform, code: str, example: Example) -> str:
    module, _ = transform.apply(cst.parse_module(code), example.site)
    return module.code


def check_example(transform: Transform, example: Example) -> None:
    once = _apply(transform, example.before, example)
    assert once == example.after
    assert _apply(transform, once, example) == once
    compile(once, "example.py", "exec")
    if once != example.before or MARKER not in example.before:
        assert revert_text(once, example.site.path) == example.before
