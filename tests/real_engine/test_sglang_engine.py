"""The real SGLang 0.5.23 engine on this CPU: the seed's DeepSeek-V3 case, unpatched and patched (engine tier).

The environment is ``sglang_cpu.env_spec('0.5.23')``'s, built by
``environments.ensure`` (``patchcraft engine env``; about 7 minutes, 3.4 GB);
skipped when it is absent. Each run is
``inenv/sglang_run.py`` in that environment: a tiny random DeepSeek-V3
(3 layers, MLA, 4 routed experts + 1 shared) and an EAGLE-3 draft for ids
``[-1, 0, 1]``, SGLang's offline engine with patchcraft's kernel stand-ins.
Unpatched, the target cannot capture the embedding output: the capture
error, with its file and line. On a copy of the install patched by
``patchcraft apply``, the draft receives hs[0], hs[1], hs[2], and greedy
output equals transformers'. About 2 minutes a run on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchcraft.real_engine import environments, sglang_cpu

RELEASE = "0.5.23"
PROMPTS = [[5, 17, 33, 9, 100, 7, 250, 3]]
RUN_TIMEOUT = 600


ENV = environments.find(sglang_cpu.env_spec(RELEASE))
needs_env = pytest.mark.skipif(ENV is None, reason="sglang-cpu-0.5.23's environment is absent: patchcraft engine env")
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("sglang-engine"), needs_env]


@pytest.fixture(scope="module")
def env():
    assert ENV is not None
    return ENV


def _run(env, tmp: Path, layer_ids, pythonpath=None, **extra):
    spec = {
        "engine": "sglang",
        "family": "deepseek_v3",
        "num_layers": 3,
        "layer_ids": layer_ids,
        "workdir": str(tmp / "work"),
        "prompt_token_ids": PROMPTS,
        "max_tokens": 8,
        "seed": 0,
        "draft_dir": None,
        "target_dir": None,
        "timeout_s": RUN_TIMEOUT - 60,
        **extra,
    }
    spec_path, result_path = tmp / "spec.json", tmp / "result.json"
    spec_path.write_text(json.dumps(spec))
    extra_env = {"PYTHONPATH": str(pythonpath)} if pythonpath else {}
    proc = subprocess.run(
        [str(env.python), str(sglang_cpu.script()), str(spec_path), str(result_path)],
        env=environments.environ_for(env, extra_env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(result_path.read_text())


def test_the_standins_equal_sglangs_own_triton_kernels(env, tmp_path):
    out = tmp_path / "check.json"
    script = sglang_cpu.INENV / "sglang_standins_check.py"
    proc = subprocess.run(
        [str(env.python), str(script), str(out)],
        env=environments.environ_for(env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    compared = {name: row for name, row in report.items() if row["ok"] is not None}
    assert len(compared) == 7 and all(row["ok"] for row in compared.values()), report


def test_unpatched_deepseek_v3_stops_at_the_embedding_capture(env, tmp_path):
    result = _run(env, tmp_path, [-1, 0, 1])
    assert result["ok"] is False
    assert result["engine_version"] == RELEASE
    assert result["engine_file"] == str(sglang_cpu.package(env) / "__init__.py")
    error = result["error"]
    assert error["type"] == "RuntimeError" and error["message"] == "captured 2 of 3 aux hidden states"
    assert (error["file"], error["line"]) == ("sglang/srt/layers/aux_hidden_states.py", 87)
    assert error["model_frame"] == "sglang/srt/models/deepseek_v2.py:3245"


def test_a_copy_patched_by_apply_feeds_the_draft_the_embedding_output(env, tmp_path):
    copy = tmp_path / "overlay"
    shutil.copytree(sglang_cpu.package(env), copy / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    apply = subprocess.run(
        [sys.executable, "-m", "patchcraft", "apply", str(copy / "sglang"), "--model", "deepseek_v2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert apply.returncode == 0, apply.stdout + apply.stderr
    result = _run(env, tmp_path, [-1, 0, 1], pythonpath=copy)
    assert result["ok"] is True, result["error"]
    assert result["engine_file"] == str(copy / "sglang" / "__init__.py")
    assert [row["state"] for row in result["fed"]] == ["hs[0]", "hs[1]", "hs[2]"]
    assert result["fed"][0]["max_abs_diff"] == 0.0
    assert result["greedy_equal"] is True and result["tokens"] == result["reference_tokens"]
    assert result["spec_metrics"]["accept_length"] >= 1.0
    assert len(result["kernels"]) == 8
    assert any("torch_native" in note for note in result["notes"])


@pytest.mark.skipif(ENV is None, reason="sglang-cpu-0.5.23's environment is absent: patchcraft engine env")
def test_engine_check_runs_the_seed_case_unpatched_and_through_patchcraft_run(capsys: pytest.CaptureFixture) -> None:
    """patchcraft engine check --engine sglang: DeepSeek-V3 [-1, 0, 1] unpatched fails as explain says (the
    packer's count); through patchcraft run (the overlay, the install untouched) chunk 0 is the embedding."""
    import json

    from conftest import run_cli

    args = ("engine", "check", "--engine", "sglang", "--model", "DeepseekV3ForCausalLM", "--num-layers", "3")
    args += ("--layer-ids=-1,0,1", "--format", "json")
    code, out, _ = run_cli(capsys, *args)
    unpatched = json.loads(out)
    assert code == 0 and unpatched["agree"] and unpatched["real"]["error"]["type"] == "RuntimeError", unpatched["why"]
    code, out, _ = run_cli(capsys, *args, "--patched")
    patched = json.loads(out)
    assert code == 0 and patched["agree"], patched["why"]
    assert [s["state"] for s in patched["real"]["fed"]] == ["hs[0]", "hs[1]", "hs[2]"]
