"""inenv/sglang_run.py on bad input: RESULT.json is written, ok false with one error, never a traceback (no SGLang needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "patchcraft" / "real_engine" / "inenv" / "sglang_run.py"
GOOD = {
    "engine": "sglang",
    "family": "deepseek_v3",
    "num_layers": 3,
    "layer_ids": [-1, 0, 1],
    "workdir": "/nonexistent-not-reached",
    "prompt_token_ids": [[5, 17, 33]],
    "max_tokens": 8,
    "seed": 0,
    "draft_dir": None,
    "target_dir": None,
}


def _run(tmp_path: Path, spec_text: str):
    spec, out = tmp_path / "spec.json", tmp_path / "result.json"
    spec.write_text(spec_text)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(spec), str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "change, words",
    [
        ({"family": "gpt2"}, "family 'gpt2'"),
        ({"engine": "vllm"}, "this script runs sglang"),
        ({"layer_ids": [-1, 0]}, "expected three ints"),
        ({"layer_ids": [-1, 0, 3]}, "from -1 to 2"),
        ({"layer_ids": [-2, 0, 1]}, "from -1 to 2"),
        ({"num_layers": "3"}, "num_layers '3'"),
        ({"prompt_token_ids": []}, "prompt_token_ids"),
        ({"prompt_token_ids": [[5, 2000]]}, "below 1024"),
        ({"max_tokens": 0}, "max_tokens 0"),
        ({"workdir": None}, "workdir"),
        ({"draft_dir": "/nonexistent"}, "draft_dir '/nonexistent': not a model folder"),
        ({"tree_kernels": "cuda"}, "tree_kernels 'cuda'"),
    ],
)
def test_a_bad_spec_is_one_error_in_the_result(tmp_path, change, words):
    result = _run(tmp_path, json.dumps({**GOOD, **change}))
    assert result["ok"] is False and result["engine"] == "sglang" and result["platform"] == "cpu"
    assert result["error"]["type"] == "SpecError" and words in result["error"]["message"]
    assert "wall_s" in result


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null"])
def test_an_unreadable_spec_is_one_error_in_the_result(tmp_path, text):
    result = _run(tmp_path, text)
    assert result["ok"] is False and result["error"]["type"] == "SpecError"


def test_usage(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: sglang_run.py SPEC.json RESULT.json" in proc.stderr
