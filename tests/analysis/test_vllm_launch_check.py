"""The vLLM launch check: what the release's code feeds the draft against what it was trained on (0.34.0, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import vllm_release_package
from drafts import kimi_target, speculators_draft
from patchcraft.analysis.training import parse_training
from patchcraft.analysis.vllm_launch_check import Verdict, check_launch
from patchcraft.reading.draft_config import read_draft, read_target

pytest.importorskip("torch")


def _check(tmp_path: Path, ids: list[int], training: str | None = None):
    draft = read_draft(speculators_draft(tmp_path / "draft", ids))
    target = read_target(kimi_target(tmp_path / "kimi"))
    return check_launch(vllm_release_package("0.34.0"), draft, target, parse_training(training) if training else None)


def test_the_release_as_shipped_crashes_on_id_0(tmp_path: Path) -> None:
    """Unpatched 0.34.0: id 0 crashes DeepseekV2Model.forward (residual is None at layer 0): a mismatch, never ok."""
    result = _check(tmp_path, [0, 3, 31])
    assert result.verdict is Verdict.MISMATCH and "id 0 crashes the forward" in result.reason, result
    assert any("trained on: [hs[0], hs[3], hs[31]]" in line for line in result.lines)


def test_ids_without_0_are_fed_as_trained(tmp_path: Path) -> None:
    result = _check(tmp_path, [2, 30, 58])
    assert result.verdict is Verdict.OK, result
    assert result.reason == "ok: vLLM will feed the draft [hs[2], hs[30], hs[58]], as trained"


def test_other_states_than_trained_and_a_short_fc_are_mismatches(tmp_path: Path) -> None:
    result = _check(tmp_path, [2, 30, 58], "hf:3,31,59")
    assert result.verdict is Verdict.MISMATCH
    assert (
        result.reason == "vLLM will feed [hs[2], hs[30], hs[58]] but the draft was trained on [hs[3], hs[31], hs[59]]"
    )
    two = _check(tmp_path, [30, 58])  # the fc takes three states of 7168
    assert two.verdict is Verdict.MISMATCH and "fc takes 21504 inputs" in two.reason


def test_a_target_config_without_an_architecture_is_unchecked(tmp_path: Path) -> None:
    target = tmp_path / "bare"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 61, "hidden_size": 7168}))
    draft = read_draft(speculators_draft(tmp_path / "draft", [2, 30, 58]))
    result = check_launch(vllm_release_package("0.34.0"), draft, read_target(target), None)
    assert result.verdict is Verdict.UNCHECKED and "names no architecture" in result.reason
