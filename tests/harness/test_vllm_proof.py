"""patchcraft.harness.vllm_proof: the proof apply runs before writing vLLM's embedding capture.

It passes on what ``vllm_capture_embedding`` writes into 0.34.0's DeepseekV2Model.forward (0.18.0 in the
full tier), and fails, naming the scenario, on a capture that is not a copy, on one that changes ids
without 0, and on the release unpatched (id 0 crashes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import vllm_release_package

from patchcraft.base.status import EditKind, HarnessStatus
from patchcraft.engine.file_patch import patch_text
from patchcraft.harness.vllm_proof import prove_model
from patchcraft.planning.records import EditSite

pytest.importorskip("torch")

MODEL = "deepseek_v2.DeepseekV3ForCausalLM"


def _patched(version: str) -> tuple[Path, Path, str]:
    package = vllm_release_package(version)
    path = package / "model_executor" / "models" / "deepseek_v2.py"
    site = EditSite(EditKind.VLLM_FORWARD, path, "deepseek_v2", "DeepseekV2Model", "forward")
    patch = patch_text(path.read_text(), path, [site])
    assert not patch.errors
    return package, path, patch.after


@pytest.mark.parametrize("version", ["0.34.0", pytest.param("0.18.0", marks=pytest.mark.slow)])
def test_the_written_edit_is_proven(version: str) -> None:
    package, path, after = _patched(version)
    row = prove_model(package, MODEL, "deepseek_v2.py", {path: after})
    assert row.status is HarnessStatus.PASS, row.message
    assert [c.name for c in row.checks] == ["vllm-id-0", "vllm-same"]


def test_the_release_unpatched_fails_on_id_0() -> None:
    package = vllm_release_package("0.34.0")
    row = prove_model(package, MODEL, "deepseek_v2.py", {})
    assert row.status is HarnessStatus.FAIL and row.scenario == "vllm-id-0" and "crash: TypeError" in row.message


def test_a_capture_that_is_no_copy_fails() -> None:
    package, path, after = _patched("0.34.0")
    broken = after.replace("aux_hidden_states.append(hidden_states.clone())", "aux_hidden_states.append(hidden_states)")
    assert broken != after
    row = prove_model(package, MODEL, "deepseek_v2.py", {path: broken})
    assert row.status is HarnessStatus.FAIL and row.scenario == "vllm-id-0" and "not a copy" in row.message


def test_an_edit_that_changes_ids_without_0_fails() -> None:
    package, path, after = _patched("0.34.0")
    ids = "self.aux_hidden_state_layers"
    broken = after.replace(f"and 0 in {ids}:", f"and (0 in {ids} or 2 in {ids}):", 1)  # hs[0] for (2, 5) too
    assert broken != after
    row = prove_model(package, MODEL, "deepseek_v2.py", {path: broken})
    assert row.status is HarnessStatus.FAIL and row.scenario == "vllm-same" and "the release fed" in row.message
