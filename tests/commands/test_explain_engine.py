"""``patchcraft explain --engine vllm``: the dispatch, its exit codes and its one-line errors."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli, vllm_release_package

pytest.importorskip("torch")


def test_explain_engine_vllm_release(capsys) -> None:
    vllm_release_package("0.34.0")  # through the suite's cache
    code, out, err = run_cli(
        capsys, "explain", "--engine", "vllm", "--release", "0.34.0", "--model", "DeepseekV3ForCausalLM",
        "--layer-ids", "0,3,31", "--num-layers", "61",
    )  # fmt: skip
    assert code == 1 and out.startswith("vllm 0.34.0 at ")
    assert "warning: id 0 crashes the forward: TypeError" in out and "deepseek_v2.py:" in out


def test_a_vllm_target_is_detected_and_json_is_one_document(capsys) -> None:
    package = vllm_release_package("0.34.0")
    code, out, err = run_cli(
        capsys, "explain", str(package), "--model", "llama", "--layer-ids", "2,3,4", "--num-layers", "6",
        "--format", "json",
    )  # fmt: skip
    document = json.loads(out)
    assert code == 0 and document["engine"] == "vllm" and document["fed_states"] == [2, 3, 4]


@pytest.mark.parametrize(
    "extra, words",
    [
        ((), "--engine vllm needs --model"),
        (("--model", "llama", "--overlay", "x"), "vLLM overlays are not built yet"),
        (("--model", "NoSuchForCausalLM"), "NoSuchForCausalLM: no such model class"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, extra, words: str) -> None:
    package = vllm_release_package("0.34.0")
    code, out, err = run_cli(
        capsys, "explain", "--engine", "vllm", str(package), "--layer-ids", "2,3", "--num-layers", "6", *extra
    )
    assert code == 2 and words in err and err.count("\n") == 1
