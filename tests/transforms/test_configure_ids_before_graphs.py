"""``configure_ids_before_graphs``'s own before/after examples (transforms/examples/configure_ids_before_graphs.py), as tests."""

from __future__ import annotations

import pytest

from example_checks import cases, check_example  # tests/transforms/ (pytest puts it on sys.path)
from patchcraft.transforms.examples import configure_ids_before_graphs as examples


@pytest.mark.parametrize("example", cases(examples))
def test_example(example) -> None:
    check_example(examples.TRANSFORM, example)
