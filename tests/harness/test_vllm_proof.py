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


MIXIN_MODEL = "llama.LlamaForCausalLM"


def _mixin_patched(version: str) -> tuple[Path, Path, str]:
    package = vllm_release_package(version)
    path = package / "model_executor" / "models" / "interfaces.py"
    site = EditSite(EditKind.VLLM_MIXIN, path, "interfaces", "EagleModelMixin", "_maybe_add_hidden_state")
    patch = patch_text(path.read_text(), path, [site])
    assert not patch.errors
    return package, path, patch.after


@pytest.mark.parametrize("version", ["0.34.0", pytest.param("0.18.0", marks=pytest.mark.slow)])
def test_the_mixin_edit_is_proven_id_0_a_copy_equal_to_hs_0_after_the_forward(version: str) -> None:
    package, path, after = _mixin_patched(version)
    row = prove_model(package, MIXIN_MODEL, "llama.py", {path: after}, mixin=True)
    assert row.status is HarnessStatus.PASS, row.message
    assert [(c.name, c.status) for c in row.checks] == [
        ("vllm-id-0", HarnessStatus.PASS),
        ("vllm-same", HarnessStatus.PASS),
    ]


def test_the_mixin_release_unpatched_fails_id_0_is_the_embedding_tensor_itself() -> None:
    row = prove_model(vllm_release_package("0.34.0"), MIXIN_MODEL, "llama.py", {}, mixin=True)
    assert row.status is HarnessStatus.FAIL and row.scenario == "vllm-id-0"
    assert "hs[0] (the embedding tensor itself, not a copy)" in row.message


def test_a_mixin_edit_that_changes_ids_without_0_fails() -> None:
    package, path, after = _mixin_patched("0.34.0")
    copy = "if layer_idx == 0 and residual is None:\n                hidden_states = hidden_states.clone()"
    assert copy in after
    # every id past 0 loses its residual: layer k-1's output without it, not hs[k]
    lost = "if layer_idx == 0 or residual is not None:\n                hidden_states, residual = hidden_states.clone(), None"
    broken = after.replace(copy, lost)
    row = prove_model(package, MIXIN_MODEL, "llama.py", {path: broken}, mixin=True)
    assert row.status is HarnessStatus.FAIL and row.scenario == "vllm-id-0"
    assert "expected a copy of hs[0], hs[2], hs[7]" in row.message  # what the release fed for (2, 7)
    same = row.checks[1]
    assert same.status is HarnessStatus.FAIL and "the release fed hs[2], hs[5]" in same.detail


def test_a_mixin_row_that_cannot_show_the_edit_is_skipped_only_when_another_proved_it() -> None:
    from patchcraft.harness.runner import SmokeResult
    from patchcraft.harness.vllm_proof_rows import UNSHOWN, _mixin_rows

    passed = SmokeResult("llama.LlamaForCausalLM", "llama.py", HarnessStatus.PASS)
    unshown = SmokeResult("gpt_oss.GptOssForCausalLM", "gpt_oss.py", HarnessStatus.ERROR, f"{UNSHOWN}: not run")
    failed = SmokeResult("qwen2.Qwen2ForCausalLM", "qwen2.py", HarnessStatus.FAIL, "wrong")
    mixin = {passed.model, unshown.model, failed.model}
    rows = _mixin_rows([passed, unshown, failed], mixin)
    assert [r.status for r in rows] == [HarnessStatus.PASS, HarnessStatus.SKIPPED, HarnessStatus.FAIL]
    assert rows[1].message.endswith("the edit is EagleModelMixin's alone, proven on llama.LlamaForCausalLM")
    assert _mixin_rows([unshown], mixin) == [unshown]  # nothing proved it: the error withholds the edit


def test_a_row_whose_forward_the_harness_cannot_follow_is_skipped_when_its_shared_edit_is_proven(
    tmp_path: Path,
) -> None:
    """0.17.0's ``MistralModel.forward`` is ``return super().forward(...)``: its edit is ``LlamaModel.forward``'s,
    which Llama's row proves, while the harness finds no layer call in Mistral's own forward (not run). That row is
    skipped, naming the rows that proved the edit; it no longer withholds llama.py from every apply (issue 45)."""
    import json
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "vllm"
    shutil.copytree(vllm_release_package("0.17.0"), copy)
    command = [sys.executable, "-m", "patchcraft", "apply", str(copy), "--engine", "vllm", "--format", "json"]
    proc = subprocess.run([*command, "--model", "mistral.MistralForCausalLM"], capture_output=True, text=True)
    document = json.loads(proc.stdout)
    rows = {m["model"]: m for m in document["models"]}
    mistral = rows["mistral.MistralForCausalLM"]
    assert proc.returncode == 0, mistral["message"]
    assert mistral["status"] == "patched" and mistral["proof"] == "harness-skipped", mistral
    assert "no call of a decoder layer" in mistral["notes"][-1] and "its edits are proven on" in mistral["notes"][-1]
    assert rows["llama.LlamaForCausalLM"]["proof"] == "harness-passed"
    assert document["summary"]["written"] == ["vllm/model_executor/models/llama.py"]


V4_MODEL = "deepseek_v4.{}.DeepseekV4ForCausalLM"


def _v4_patched(platform: str) -> tuple[Path, Path, str]:
    package = vllm_release_package("0.34.0")
    path = package / "models" / "deepseek_v4" / platform / "model.py"
    site = EditSite(
        EditKind.VLLM_ADD_CAPTURE, path, f"models.deepseek_v4.{platform}.model", "DeepseekV4Model", "forward"
    )
    patch = patch_text(path.read_text(), path, [site])
    assert not patch.errors
    return package, path, patch.after


@pytest.mark.parametrize("platform", ["nvidia", "cpu"])
def test_the_added_v4_capture_is_proven_and_the_release_fails(platform: str) -> None:
    """DeepSeek-V4 (issue 46): the capture added before the loop feeds hs[0] then what the release fed; the release
    itself drops id 0 (one state fewer than its ids)."""
    package, path, after = _v4_patched(platform)
    label = V4_MODEL.format(platform)
    row = prove_model(package, label, "model.py", {path: after}, id0_only=True)
    assert row.status is HarnessStatus.PASS, row.message
    row = prove_model(package, label, "model.py", {}, id0_only=True)
    assert (
        row.status is HarnessStatus.FAIL
        and row.scenario == "vllm-id-0"
        and "expected a copy of hs[0], hs[2], hs[7]" in row.message
    )


@pytest.mark.parametrize(
    "old, new, scenario, said",
    [
        # the streams appended whole, not their mean: no hidden state of the target
        ("else hidden_states.mean(dim=1))", "else hidden_states)", "vllm-id-0", "an unknown tensor"),
        # the added capture on every stage and id: ids without 0 get an extra entry
        ("if self.start_layer == 0 and 0 in self.aux_hidden_state_layers:", "if True:", "vllm-same", "the release fed"),
    ],
    ids=["no mean", "no guard"],
)
def test_a_wrong_added_v4_capture_fails(old: str, new: str, scenario: str, said: str) -> None:
    package, path, after = _v4_patched("cpu")
    broken = after.replace(old, new, 1)
    assert broken != after
    row = prove_model(package, V4_MODEL.format("cpu"), "model.py", {path: broken}, id0_only=True)
    assert row.status is HarnessStatus.FAIL and said in row.message, row.message
    assert any(c.name == scenario and c.status is HarnessStatus.FAIL for c in row.checks)
