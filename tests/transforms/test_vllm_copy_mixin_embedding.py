"""``vllm_copy_mixin_embedding``'s own before/after examples (transforms/examples/vllm_copy_mixin_embedding.py),
as tests, and its refusals: another shape is one line naming file, class, method, line and what was expected;
a hand-made copy or a changed block is ``modified``, never doubled."""

from __future__ import annotations

import re

import libcst as cst
import pytest
from example_checks import cases, check_example  # tests/transforms/ (pytest puts it on sys.path)
from patchcraft.transforms._base import AnchorError
from patchcraft.transforms.examples import vllm_copy_mixin_embedding as examples

from patchcraft.base.status import EditStatus
from patchcraft.engine.file_patch import revert_text

SITE = examples.EXAMPLES[0].site
BEFORE = examples.EXAMPLES[0].before
AFTER = examples.EXAMPLES[0].after


@pytest.mark.parametrize("example", cases(examples))
def test_example(example) -> None:
    check_example(examples.TRANSFORM, example)


def _apply(text: str):
    return examples.TRANSFORM.apply(cst.parse_module(text), SITE)


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("        residual: torch.Tensor,\n", "", "takes no `residual`"),
        ("if layer_idx in self.aux_hidden_state_layers:", "if self.aux_hidden_state_layers:", "has no `if <parameter>"),
        ("aux_hidden_states.append(value)", "aux_hidden_states.extend(value)", "appends no `hidden_states`"),
        (
            "        return aux_hidden_states\n",
            "        if layer_idx in self.other_layers:\n            aux_hidden_states.append(hidden_states)\n"
            "        return aux_hidden_states\n",
            "found 2 such tests (lines 14, 17): ambiguous",
        ),
    ],
    ids=["no residual parameter", "no capture test", "no append", "two capture tests"],
)
def test_another_shape_is_refused_naming_file_class_method_line_and_what_was_expected(
    old: str, new: str, expected: str
) -> None:
    assert old in BEFORE
    broken = BEFORE.replace(old, new, 1)
    with pytest.raises(AnchorError, match=re.escape(expected)) as info:
        _apply(broken)
    message = str(info.value)
    assert message.startswith("interfaces.py: EagleModelMixin._maybe_add_hidden_state: expected the mixin's capture")
    assert re.search(r"\blines? \d", message) and message.endswith("file left untouched")


def test_a_missing_method_is_refused() -> None:
    with pytest.raises(AnchorError, match="one method _maybe_add_hidden_state"):
        _apply(BEFORE.replace("def _maybe_add_hidden_state(", "def _other("))


def test_a_changed_block_or_a_hand_made_copy_is_modified_never_doubled() -> None:
    edited = AFTER.replace("hidden_states = hidden_states.clone()", "hidden_states = hidden_states")
    module, outcome = _apply(edited)
    assert outcome.status is EditStatus.MODIFIED and "changed by hand" in outcome.detail and module.code == edited
    hand = BEFORE.replace("else hidden_states\n", "else hidden_states.clone()\n")
    module, outcome = _apply(hand)
    assert outcome.status is EditStatus.MODIFIED and "copies already" in outcome.detail and module.code == hand


def test_revert_gives_the_release_back_byte_for_byte() -> None:
    module, outcome = _apply(BEFORE)
    assert outcome.status is EditStatus.APPLIED
    assert revert_text(module.code, SITE.path) == BEFORE
