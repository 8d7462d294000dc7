"""patchcraft/real_engine/inenv/eagle3_torch.py: the EAGLE-3 draft step in torch that the trained drafts learn on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "patchcraft" / "real_engine" / "inenv"))

import eagle3_torch  # noqa: E402
import tiny_models  # noqa: E402


def _draft() -> tuple[dict, dict]:
    config = tiny_models.draft_config({"vocab_size": 64}, [0, 2, 3])
    return tiny_models.draft_tensors(3, 64, seed=0), config


def test_the_draft_step_is_causal_and_reads_every_state() -> None:
    """A later position never changes an earlier one's logits; each of the three states changes the output."""
    params, config = _draft()
    hidden = config["hidden_size"]
    torch.manual_seed(0)
    embeds, feats = torch.randn(6, hidden), torch.randn(6, 3 * hidden)
    logits = eagle3_torch.draft_logits(params, config, embeds, feats)
    assert logits.shape == (6, 64)
    later = feats.clone()
    later[5] += 1.0
    assert torch.equal(eagle3_torch.draft_logits(params, config, embeds, later)[:5], logits[:5])
    for slot in range(3):
        moved = feats.clone()
        moved[:, slot * hidden : (slot + 1) * hidden] += 1.0
        assert not torch.allclose(eagle3_torch.draft_logits(params, config, embeds, moved), logits)


def test_rope_rotates_by_position_and_keeps_norms() -> None:
    x = torch.randn(4, 2, 32)
    rotated = eagle3_torch.rope(x, torch.arange(4), 10000.0)
    assert torch.allclose(rotated[0], x[0]) and not torch.allclose(rotated[1], x[1])
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
