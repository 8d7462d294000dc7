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
        (("--model", "llama", "--overlay", "x"), "--overlay is the target: give no TARGET or --release with it"),
        (("--model", "NoSuchForCausalLM"), "NoSuchForCausalLM: no such model class"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, extra, words: str) -> None:
    package = vllm_release_package("0.34.0")
    code, out, err = run_cli(
        capsys, "explain", "--engine", "vllm", str(package), "--layer-ids", "2,3", "--num-layers", "6", *extra
    )
    assert code == 2 and words in err and err.count("\n") == 1


def _overlay(capsys, package, out) -> None:
    code, _, err = run_cli(capsys, "overlay", "build", str(package), "--out", str(out), "--no-smoke")
    assert code == 0, err


def test_a_vllm_overlay_is_explained_once_it_is_safe_to_serve(capsys, tmp_path) -> None:
    """--engine vllm --overlay DIR: the overlay's patched tree (id 0 a copy of hs[0]); a missing bootstrap is refused."""
    overlay = tmp_path / "overlay"
    _overlay(capsys, vllm_release_package("0.34.0"), overlay)
    args = ("explain", "--engine", "vllm", "--overlay", str(overlay), "--model", "DeepseekV3ForCausalLM")
    ids = ("--layer-ids", "0,3,31", "--num-layers", "61", "--format", "json")
    code, out, err = run_cli(capsys, *args, *ids)
    assert code == 0 and json.loads(out)["fed_states"] == [0, 3, 31], err
    (overlay / "sitecustomize.py").unlink()
    code, out, err = run_cli(capsys, *args, *ids)
    assert code == 2 and "sitecustomize.py" in err and err.count("\n") == 1 and not out


def test_an_sglang_overlay_is_not_read_as_vllm(capsys, tmp_path) -> None:
    from conftest import copy_release

    overlay = tmp_path / "overlay"
    _overlay(capsys, copy_release("0.5.10", tmp_path / "sglang"), overlay)
    code, _, err = run_cli(
        capsys, "explain", "--engine", "vllm", "--overlay", str(overlay), "--model", "llama", "--layer-ids", "2,3",
        "--num-layers", "6",
    )  # fmt: skip
    assert code == 2 and "an SGLang overlay; --engine vllm needs one built from a vLLM install" in err
