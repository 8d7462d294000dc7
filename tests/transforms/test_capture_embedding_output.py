"""``capture_embedding_output``'s own before/after examples (transforms/examples/capture_embedding_output.py), as tests."""

from __future__ import annotations

import pytest

from example_checks import cases, check_example  # tests/transforms/ (pytest puts it on sys.path)
from patchcraft.transforms.examples import capture_embedding_output as examples


@pytest.mark.parametrize("example", cases(examples))
def test_example(example) -> None:
    check_example(examples.TRANSFORM, example)
