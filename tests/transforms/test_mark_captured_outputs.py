"""``mark_captured_outputs``'s own before/after examples (transforms/examples/mark_captured_outputs.py), as tests."""

from __future__ import annotations

import pytest

from example_checks import cases, check_example  # tests/transforms/ (pytest puts it on sys.path)
from patchcraft.transforms.examples import mark_captured_outputs as examples


@pytest.mark.parametrize("example", cases(examples))
def test_example(example) -> None:
    check_example(examples.TRANSFORM, example)
