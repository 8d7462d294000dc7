"""explain --engine vllm's harness part kept by the bytes it ran (patchcraft.harness.vllm_runs).

On a copy of the real vLLM 0.32.0: the same explanation with its verdict
cache emptied answers the same without importing torch; a byte changed
in a part of the package outside the model files (the norm's module) runs
the class again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import flip_one_byte, run_reporting_torch, vllm_release_package

pytest.importorskip("torch")

RELEASE = "0.32.0"


def test_a_kept_run_answers_without_torch_and_a_changed_part_runs_again(tmp_path: Path) -> None:
    package = tmp_path / "tree" / "vllm"
    shutil.copytree(vllm_release_package(RELEASE), package)
    argv = ["explain", str(package), "--engine", "vllm", "--model", "DeepseekV3ForCausalLM"]
    argv += ["--layer-ids", "0,2,3", "--num-layers", "6"]

    def explain() -> tuple[str, str]:
        shutil.rmtree(tmp_path / "cache" / "verdicts", ignore_errors=True)  # the verdict is computed again
        done = run_reporting_torch(argv, tmp_path / "cache")
        return done.stdout, done.stderr

    first, said = explain()
    assert "crash in the forward: TypeError" in first and "torch imported: True" in said, said[-2000:]
    second, said = explain()
    assert second == first
    assert "torch imported: False" in said
    flip_one_byte(package / "model_executor" / "layers" / "layernorm.py", b"import", b"imporT")
    third, said = explain()
    assert "torch imported: True" in said, "a part of the package changed: the class is run again"
