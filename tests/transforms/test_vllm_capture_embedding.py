"""``vllm_capture_embedding``'s own before/after examples (transforms/examples/vllm_capture_embedding.py), as tests,
and its refusals: a forward without vLLM's top-of-layer capture is one line naming what was expected."""

from __future__ import annotations

import re

import libcst as cst
import pytest
from example_checks import cases, check_example  # tests/transforms/ (pytest puts it on sys.path)
from patchcraft.transforms._base import AnchorError
from patchcraft.transforms.examples import vllm_capture_embedding as examples

from patchcraft.base.status import EditStatus

SITE = examples.EXAMPLES[0].site
BEFORE = examples.EXAMPLES[0].before


@pytest.mark.parametrize("example", cases(examples))
def test_example(example) -> None:
    check_example(examples.TRANSFORM, example)


def _apply(text: str):
    return examples.TRANSFORM.apply(cst.parse_module(text), SITE)


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("if idx in self.aux_hidden_state_layers:", "if self.aux_hidden_state_layers:", "expected a layer loop"),
        ("        aux_hidden_states = []\n", "", "`aux_hidden_states = []` before the layer loop"),
        (
            "aux_hidden_states.append(hidden_states + residual)",
            "aux_hidden_states.append(hidden_states)",
            "reads no `residual`",
        ),
        ("            residual = None\n", "", "`residual` bound on every path"),
    ],
    ids=["no capture test", "no collector", "no residual read", "residual unbound"],
)
def test_another_shape_is_refused_naming_file_class_method_and_what_was_expected(
    old: str, new: str, expected: str
) -> None:
    assert old in BEFORE
    broken = BEFORE.replace(old, new, 1)
    with pytest.raises(AnchorError, match=re.escape(expected)) as info:
        _apply(broken)
    assert str(info.value).startswith("deepseek_v2.py: DeepseekV2Model.forward: expected")


def test_a_missing_forward_is_refused() -> None:
    with pytest.raises(AnchorError, match="one method forward"):
        _apply(BEFORE.replace("def forward(", "def forward_other("))


def test_a_hand_made_guard_or_capture_is_modified_never_doubled() -> None:
    guarded = BEFORE.replace(
        "if idx in self.aux_hidden_state_layers:", "if idx in self.aux_hidden_state_layers and residual is not None:"
    )
    module, outcome = _apply(guarded)
    assert outcome.status is EditStatus.MODIFIED and "hand-made `and residual is not None`" in outcome.detail
    assert module.code == guarded
    patched = examples.EXAMPLES[0].after
    edited = patched.replace("hidden_states.clone())", "hidden_states)")
    assert _apply(edited)[1].status is EditStatus.MODIFIED


def test_half_an_edit_is_completed() -> None:
    patched = examples.EXAMPLES[0].after
    without_guard = patched.replace(" and residual is not None:  # patchcraft: id 0 is captured before the loop", ":")
    module, outcome = _apply(without_guard)
    assert outcome.status is EditStatus.APPLIED and module.code == patched


GPT_OSS = next(e for e in examples.EXAMPLES if e.site.cls == "GptOssModel")


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (
            "x, residual = layer(x, positions, residual)",
            "y, residual = layer(x, positions, residual)",
            "the layer loop to thread one stream its capture reads",
        ),
        ("                x = inputs_embeds\n", "                pass\n", "`x` bound on every path"),
    ],
    ids=["stream not threaded", "stream unbound"],
)
def test_the_embedding_output_is_found_by_structure_or_refused(old: str, new: str, expected: str) -> None:
    """GPT-OSS threads ``x``: the name comes from the loop's layer call, and a broken thread is refused."""
    assert old in GPT_OSS.before
    broken = GPT_OSS.before.replace(old, new, 1)
    with pytest.raises(AnchorError, match=re.escape(expected)) as info:
        examples.TRANSFORM.apply(cst.parse_module(broken), GPT_OSS.site)
    assert str(info.value).startswith("gpt_oss.py: GptOssModel.forward: expected")
