"""``vllm_add_embedding_capture``'s own before/after examples (transforms/examples/vllm_add_embedding_capture.py), as
tests, its refusals (another shape is one line naming file, class, method and what was expected; a changed, moved or
hand-made capture before the loop is ``modified``, never doubled), and the real DeepSeek-V4 forward of every platform
of 0.33.0 and 0.34.0 (issue 46)."""

from __future__ import annotations

import re

import libcst as cst
import pytest
from conftest import vllm_release_package
from example_checks import cases, check_example  # tests/transforms/ (pytest puts it on sys.path)
from patchcraft.transforms._base import AnchorError
from patchcraft.transforms.examples import vllm_add_embedding_capture as examples

from patchcraft.base.status import EditKind, EditStatus
from patchcraft.engine.file_patch import revert_text
from patchcraft.planning.records import EditSite

SITE = examples.EXAMPLES[0].site
BEFORE = examples.EXAMPLES[0].before
AFTER = examples.EXAMPLES[0].after
GUARD = "if self.start_layer == 0 and 0 in self.aux_hidden_state_layers:"


@pytest.mark.parametrize("example", cases(examples))
def test_example(example) -> None:
    check_example(examples.TRANSFORM, example)


def _apply(text: str, site=SITE):
    return examples.TRANSFORM.apply(cst.parse_module(text), site)


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (
            "hidden_states, residual, post_mix, res_mix = layer(",
            "hidden_states, residual, post_mix, res_mix = f(",
            "found no loop",
        ),
        ("if (idx + 1) in self.aux_hidden_state_layers:", "if idx in self.aux_hidden_state_layers:", "found no loop"),
        ("            start=self.start_layer,\n", "", "no `enumerate(..., start=...)`"),
        ("aux_recon.mean(dim=1)", "aux_recon.sum(dim=1)", "holds 0 `.mean(dim=1)`"),
        (
            "aux_hidden_states.append(aux_recon.mean(dim=1))",
            "kept = aux_recon.mean(dim=1)",
            "nothing after the `.mean(dim=1)` appends it",
        ),
    ],
    ids=["no layer call", "top-of-layer test", "no first layer", "no mean", "no append"],
)
def test_another_shape_is_refused_naming_file_class_method_and_what_was_expected(
    old: str, new: str, expected: str
) -> None:
    assert old in BEFORE
    broken = BEFORE.replace(old, new, 1)
    with pytest.raises(AnchorError, match=re.escape(expected)) as info:
        _apply(broken)
    message = str(info.value)
    assert message.startswith("model.py: DeepseekV4Model.forward: expected a layer loop capturing after each layer")
    assert message.endswith("file left untouched")


def test_a_changed_block_a_moved_one_or_a_hand_made_capture_is_modified_never_doubled() -> None:
    changed = AFTER.replace("hidden_states.mean(dim=1))\n        for", "hidden_states.sum(dim=1))\n        for")
    assert changed != AFTER
    module, outcome = _apply(changed)
    assert outcome.status is EditStatus.MODIFIED and "changed by hand" in outcome.detail and module.code == changed
    marked = [line for line in AFTER.splitlines(keepends=True) if "# patchcraft:" in line]
    block = (
        "".join(marked)
        + f"        {GUARD}\n"
        + "".join(
            line
            for line in AFTER.splitlines(keepends=True)
            if line.startswith("            aux_hidden_states.append(hidden_states.clone()")
        )
    )
    moved = AFTER.replace(block, "").replace(
        "        residual, post_mix, res_mix = None, None, None\n",
        block + "        residual, post_mix, res_mix = None, None, None\n",
    )
    assert moved != AFTER
    module, outcome = _apply(moved)
    assert outcome.status is EditStatus.MODIFIED and "moved by hand" in outcome.detail and module.code == moved
    hand = BEFORE.replace(
        "        for idx, layer in enumerate(",
        "        if 0 in self.aux_hidden_state_layers:\n            aux_hidden_states.append(hidden_states.mean(dim=1))\n"
        "        for idx, layer in enumerate(",
    )
    module, outcome = _apply(hand)
    assert outcome.status is EditStatus.MODIFIED and "exists already" in outcome.detail and module.code == hand


def test_revert_gives_the_release_back_byte_for_byte() -> None:
    for example in examples.EXAMPLES[:2]:
        module, outcome = _apply(example.before)
        assert outcome.status is EditStatus.APPLIED
        assert revert_text(module.code, SITE.path) == example.before


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize("platform", ["nvidia", "amd", "xpu", "cpu"])
def test_the_real_deepseek_v4_forward(version: str, platform: str) -> None:
    """The release's own ``DeepseekV4Model.forward`` of each platform: one block right before the layer loop,
    recognised again, reverted exactly."""
    path = vllm_release_package(version) / "models" / "deepseek_v4" / platform / "model.py"
    text = path.read_text()
    module_name = f"models.deepseek_v4.{platform}.model"
    site = EditSite(EditKind.VLLM_ADD_CAPTURE, path, module_name, "DeepseekV4Model", "forward")
    module, outcome = _apply(text, site)
    assert outcome.status is EditStatus.APPLIED
    patched = module.code
    lines = patched.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == GUARD)
    assert lines[at - 1].strip().startswith("# patchcraft: vLLM id 0 is hs[0]") and patched.count(GUARD) == 1
    after = next(i for i in range(at + 1, len(lines)) if lines[i].strip().startswith("for idx, layer in enumerate("))
    assert any("aux_hidden_states.append(" in line for line in lines[at:after])
    assert _apply(patched, site)[1].status is EditStatus.PRESENT
    assert revert_text(patched, path) == text
