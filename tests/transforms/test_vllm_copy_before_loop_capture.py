"""``vllm_copy_before_loop_capture``'s own before/after examples (transforms/examples/vllm_copy_before_loop_capture.py),
as tests, its refusals (another shape is one line naming file, class, method and what was expected; a hand-made
copy or a changed statement is ``modified``, never doubled), and the real Kimi-Linear forward of 0.33.0 and 0.34.0
(issue 46)."""

from __future__ import annotations

import re

import libcst as cst
import pytest
from conftest import vllm_release_package
from example_checks import cases, check_example  # tests/transforms/ (pytest puts it on sys.path)
from patchcraft.transforms._base import AnchorError
from patchcraft.transforms.examples import vllm_copy_before_loop_capture as examples

from patchcraft.base.status import EditKind, EditStatus
from patchcraft.engine.file_patch import revert_text
from patchcraft.planning.records import EditSite

SITE = examples.EXAMPLES[0].site
BEFORE = examples.EXAMPLES[0].before
AFTER = examples.EXAMPLES[0].after
COPY = "aux_hidden_states[-1] = aux_hidden_states[-1].clone()"


@pytest.mark.parametrize("example", cases(examples))
def test_example(example) -> None:
    check_example(examples.TRANSFORM, example)


def _apply(text: str, site=SITE):
    return examples.TRANSFORM.apply(cst.parse_module(text), site)


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("hidden_states, prefix_sum, residual = layer(", "hidden_states, prefix_sum, residual = f(", "found no loop"),
        ("and self.start_layer in self.aux_hidden_state_layers", "and self.start_layer", "nothing is captured"),
        (
            "aux_hidden_states.append(hidden_states)\n",
            "aux_hidden_states.append(hidden_states * 1)\n",
            "appends no name",
        ),
        (
            "        prefix_sum = None\n",
            "        if 0 in self.aux_hidden_state_layers:\n            aux_hidden_states.append(hidden_states)\n"
            "        prefix_sum = None\n",
            "found 2 such captures before the loop: ambiguous",
        ),
    ],
    ids=["no layer loop", "no capture test", "no name appended", "two captures"],
)
def test_another_shape_is_refused_naming_file_class_method_and_what_was_expected(
    old: str, new: str, expected: str
) -> None:
    assert old in BEFORE
    broken = BEFORE.replace(old, new, 1)
    with pytest.raises(AnchorError, match=re.escape(expected)) as info:
        _apply(broken)
    message = str(info.value)
    assert message.startswith("model.py: KimiLinearModel.forward: expected a capture before the layer loop")
    assert message.endswith("file left untouched")


def test_a_capture_inside_or_after_the_loop_is_not_this_edit() -> None:
    """Only the capture before the loop, in the loop's block: the loop's own ``idx + 1`` capture is never copied."""
    module, outcome = _apply(BEFORE)
    assert outcome.status is EditStatus.APPLIED and module.code.count(COPY) == 1
    assert module.code.index(COPY) < module.code.index("for layer_idx, layer in enumerate(")


def test_a_changed_statement_a_moved_one_or_a_hand_made_copy_is_modified_never_doubled() -> None:
    changed = AFTER.replace(COPY, "aux_hidden_states[-1] = aux_hidden_states[-1]")
    module, outcome = _apply(changed)
    assert outcome.status is EditStatus.MODIFIED and "changed by hand" in outcome.detail and module.code == changed
    marked = [line for line in AFTER.splitlines(keepends=True) if "# patchcraft:" in line or COPY in line]
    moved = AFTER.replace("".join(marked), "").replace(
        "        prefix_sum = None\n",
        "".join(line.replace("                ", "        ") for line in marked) + "        prefix_sum = None\n",
    )
    module, outcome = _apply(moved)
    assert outcome.status is EditStatus.MODIFIED and "moved by hand" in outcome.detail and module.code == moved
    hand = BEFORE.replace(
        "aux_hidden_states.append(hidden_states)\n",
        f"aux_hidden_states.append(hidden_states)\n                {COPY}\n",
    )
    module, outcome = _apply(hand)
    assert outcome.status is EditStatus.MODIFIED and "copies already" in outcome.detail and module.code == hand


def test_revert_gives_the_release_back_byte_for_byte() -> None:
    module, outcome = _apply(BEFORE)
    assert outcome.status is EditStatus.APPLIED
    assert revert_text(module.code, SITE.path) == BEFORE


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_real_kimi_linear_forward(version: str) -> None:
    """The release's own ``KimiLinearModel.forward``: one copy, right after the append by name, reverted exactly."""
    path = vllm_release_package(version) / "models" / "kimi_k3" / "nvidia" / "model.py"
    text = path.read_text()
    site = EditSite(EditKind.VLLM_BEFORE_LOOP, path, "models.kimi_k3.nvidia.model", "KimiLinearModel", "forward")
    module, outcome = _apply(text, site)
    assert outcome.status is EditStatus.APPLIED
    patched = module.code
    lines = patched.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == COPY)
    assert lines[at - 2].strip() == "aux_hidden_states.append(hidden_states)" and patched.count(COPY) == 1
    assert lines[at - 1].strip().startswith("# patchcraft: vLLM id 0 is hs[0]")
    assert _apply(patched, site)[1].status is EditStatus.PRESENT
    assert revert_text(patched, path) == text
