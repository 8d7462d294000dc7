"""GPT-OSS on real vLLM releases: its inner model threads ``x``, not ``hidden_states``, and embeds through
``self.embed_input_ids(input_ids)`` (``self.embedding``), so the harness and the transform find both by
structure.

0.11-0.17 (``GptOssModel.forward``): the loop captures ``x if residual is None else x + residual`` at the
top of each layer, so id 0 is the embedding tensor itself, which layer 0 takes as its residual and its
fused add-norm overwrites in place. ``vllm_capture_embedding`` appends ``x.clone()`` before the loop and
guards the loop's capture; the proof (the release's own setter and forward, patched and as it was) shows
id 0 a copy of hs[0]. From 0.18 the forward captures through ``EagleModelMixin`` and the harness now runs
it too (it was "not run": no layer call with ``hidden_states``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import vllm_release_package

from patchcraft.base.status import EditKind, HarnessStatus
from patchcraft.engine.file_patch import patch_text
from patchcraft.harness.served import Fed
from patchcraft.harness.shapes import layer_call
from patchcraft.harness.vllm_proof import prove_model
from patchcraft.harness.vllm_served import find_model, run_ids
from patchcraft.planning.records import EditSite

pytest.importorskip("torch")

MODEL = "gpt_oss.GptOssForCausalLM"
LAYERS = 8


def _patched(version: str) -> tuple[Path, Path, str]:
    package = vllm_release_package(version)
    path = package / "model_executor" / "models" / "gpt_oss.py"
    site = EditSite(EditKind.VLLM_FORWARD, path, "gpt_oss", "GptOssModel", "forward")
    patch = patch_text(path.read_text(), path, [site])
    assert not patch.errors, patch.errors
    return package, path, patch.after


@pytest.mark.parametrize(
    "version",
    ["0.11.2", pytest.param("0.11.0", marks=pytest.mark.slow), pytest.param("0.17.0", marks=pytest.mark.slow)],
)
def test_gpt_oss_is_patched_and_proven_id_0_a_copy_of_hs_0(version: str) -> None:
    package, path, after = _patched(version)
    assert "aux_hidden_states.append(x.clone())" in after
    assert "if i in self.aux_hidden_state_layers and residual is not None:  # patchcraft:" in after
    row = prove_model(package, MODEL, "gpt_oss.py", {path: after})
    assert row.status is HarnessStatus.PASS, row.message
    assert [c.name for c in row.checks] == ["vllm-id-0", "vllm-same"]
    run = run_ids(find_model(package, MODEL, {path: after}), (0, 2, LAYERS - 1), LAYERS)
    assert run.outcome.fed == (Fed(0, True), Fed(2, True), Fed(LAYERS - 1, True)) and not run.aliased_holds


def test_gpt_oss_unpatched_runs_and_id_0_is_the_embedding_tensor_itself() -> None:
    package = vllm_release_package("0.11.2")
    model = find_model(package, MODEL)
    forward = model.program.method(model.forward_owner, "forward")
    assert forward is not None
    call = layer_call(forward)  # ``x, residual = layer(x, positions, residual)``
    assert call.hidden == (0, None) and call.residual == (2, None) and call.outputs == ("hidden_states", "residual")
    run = run_ids(model, (0, 2), LAYERS)
    assert run.outcome.ran and run.outcome.fed == (Fed(0, False), Fed(2, True))
    assert run.aliased_holds == ((0, f"hs[{LAYERS}]"),)  # overwritten in place by the layers' fused add-norm
    row = prove_model(package, MODEL, "gpt_oss.py", {})
    assert row.status is HarnessStatus.FAIL and row.scenario == "vllm-id-0" and "not a copy" in row.message


def test_a_gpt_oss_capture_that_is_no_copy_fails() -> None:
    package, path, after = _patched("0.11.2")
    broken = after.replace("aux_hidden_states.append(x.clone())", "aux_hidden_states.append(x)")
    assert broken != after
    row = prove_model(package, MODEL, "gpt_oss.py", {path: broken})
    assert row.status is HarnessStatus.FAIL and row.scenario == "vllm-id-0" and "not a copy" in row.message


def test_gpt_oss_with_the_mixin_is_run_and_its_edit_proven() -> None:
    """0.34.0: the harness runs GPT-OSS's mixin forward (it threads ``x``), and the mixin's edit makes id 0 a copy."""
    package = vllm_release_package("0.34.0")
    run = run_ids(find_model(package, MODEL), (0, 2), LAYERS)
    assert run.outcome.ran and run.outcome.fed == (Fed(0, False), Fed(2, True))
    path = package / "model_executor" / "models" / "interfaces.py"
    site = EditSite(EditKind.VLLM_MIXIN, path, "interfaces", "EagleModelMixin", "_maybe_add_hidden_state")
    patch = patch_text(path.read_text(), path, [site])
    assert not patch.errors
    row = prove_model(package, MODEL, "gpt_oss.py", {path: patch.after}, mixin=True)
    assert row.status is HarnessStatus.PASS, row.message
