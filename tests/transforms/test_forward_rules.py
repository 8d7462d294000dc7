"""capture_embedding_output beyond its examples: hand fixes judged by what they do, earlier blocks upgraded.

A hand-made embedding capture counts only where patchcraft's block would
sit and when it appends a copy of the embedding output; anything else is
``modified`` with the line named, without ``--smoke``.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from patchcraft.engine.file_patch import revert_text
from patchcraft.planning.records import EditSite
from patchcraft.transforms import capture_embedding_output as forward

SITE = EditSite(kind="forward", path=Path("m.py"), module="m", cls="DeepseekV2Model", method="forward")
SEED_BLOCK = """\
        # Capture embedding output for EAGLE3 if requested (layer_id=-1)
        if self.capture_embedding_for_eagle3:
            # At this point hidden_states = embed_output, residual = None
            aux_hidden_states.append(hidden_states.clone() if residual is None else hidden_states + residual)
"""
HEAD = """\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
"""
LOOP = """\
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
"""
TAIL = """\
        return hidden_states, aux_hidden_states
"""


def outcome(code: str):
    module, result = forward.apply(cst.parse_module(code), SITE)
    return module.code, result


def test_seed_fix_in_place_is_hand_applied() -> None:
    code = HEAD + SEED_BLOCK + LOOP + TAIL
    assert outcome(code) == (code, forward.Outcome("hand-applied"))


def test_seed_fix_moved_before_return_is_modified() -> None:
    code = HEAD + LOOP + SEED_BLOCK + TAIL
    after, result = outcome(code)
    assert after == code
    assert result.status == "modified"
    assert result.detail.startswith("line 11: the hand-made embedding capture is misplaced"), result.detail


def test_seed_fix_before_the_embedding_is_modified() -> None:
    code = (
        HEAD.replace("        aux_hidden_states = []\n", "").replace(
            "        hidden_states = self.embed_tokens",
            "        aux_hidden_states = []\n" + SEED_BLOCK + "        hidden_states = self.embed_tokens",
        )
        + LOOP
        + TAIL
    )
    _, result = outcome(code)
    assert result.status == "modified" and "`hidden_states` changes between" in result.detail, result.detail


def test_uncloned_seed_fix_is_modified() -> None:
    code = (
        HEAD
        + SEED_BLOCK.replace("hidden_states.clone() if residual is None else hidden_states + residual", "hidden_states")
        + LOOP
        + TAIL
    )
    _, result = outcome(code)
    assert result.status == "modified", result
    assert result.detail.startswith("line 7: the hand-made embedding capture does not append a copy"), result.detail


@pytest.mark.parametrize(
    "body", ["aux_hidden_states.append(hidden_states.clone())", "aux_hidden_states.append(torch.clone(hidden_states))"]
)
def test_other_copies_count(body: str) -> None:
    code = HEAD + f"        if self.capture_embedding_for_eagle3:\n            {body}\n" + LOOP + TAIL
    assert outcome(code)[1].status == "hand-applied"


def test_appending_elsewhere_is_modified() -> None:
    code = (
        HEAD
        + "        if self.capture_embedding_for_eagle3:\n            other.append(hidden_states.clone())\n"
        + LOOP
        + TAIL
    )
    assert outcome(code)[1].status == "modified"


def test_earlier_block_is_brought_up_to_date_and_reverts() -> None:
    pristine = HEAD + LOOP + TAIL
    current, first = outcome(pristine)
    assert first.status == "applied"
    earlier = current.replace(
        'getattr(self, "capture_embedding_for_eagle3", False)', "self.capture_embedding_for_eagle3"
    )
    assert earlier != current
    assert revert_text(earlier, SITE.path) == pristine
    assert outcome(earlier) == (current, forward.Outcome("applied"))


PACKER = """\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = AuxHiddenStatePacker(len(self.layers_to_capture))
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        return hidden_states, aux_hidden_states.finalize()
"""


def test_earlier_packer_count_is_brought_up_to_date_and_reverts() -> None:
    current, _ = outcome(PACKER)
    earlier = current.replace(
        'getattr(self, "capture_embedding_for_eagle3", False)', "self.capture_embedding_for_eagle3"
    )
    assert "int(self.capture_embedding_for_eagle3)" in earlier
    assert revert_text(earlier, SITE.path) == PACKER
    assert outcome(earlier) == (current, forward.Outcome("applied"))
    assert outcome(current)[1].status == "present"
