"""vLLM's proof rows kept by the bytes they ran (patchcraft.harness.vllm_proof_rows, harness.run_cache).

On copies of the real vLLM 0.11.2: ``apply --model llama`` proves its rows on
the harness (torch imported); a second copy of the same release is proven
from the kept rows, the same rows, without importing torch; a byte changed
in a part of the package outside the model files (the norm's module) runs
the harness again. A planted failing row is kept as it failed: the second
apply withholds the patch as the first did.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import flip_one_byte, run_reporting_torch, vllm_release_package
from types import SimpleNamespace

from patchcraft.base.status import EditKind, EditStatus, HarnessStatus, ModelStatus
from patchcraft.engine.records import EditResult, ModelResult
from patchcraft.harness.rows import SmokeResult
from patchcraft.harness.vllm_proof_rows import UNSHOWN, proof_rows

RELEASE = "0.11.2"


def _apply(tree: Path, cache: Path) -> tuple[dict, str]:
    argv = ["apply", str(tree), "--engine", "vllm", "--no-runner", "--model", "llama", "--format", "json"]
    done = run_reporting_torch(argv, cache)
    document = json.loads(done.stdout)
    for model in document["models"]:
        model.pop("seconds", None)
    return document, done.stderr


def test_a_second_copy_is_proven_from_the_kept_rows_without_torch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    copies = [shutil.copytree(vllm_release_package(RELEASE), tmp_path / name / "vllm") for name in "abc"]
    first, said = _apply(copies[0], tmp_path / "cache")
    proofs = {m["model"]: m["proof"] for m in first["models"] if m["status"] == "patched"}
    assert proofs and "harness-passed" in proofs.values(), first
    assert "torch imported: True" in said, said[-2000:]
    second, said = _apply(copies[1], tmp_path / "cache")
    assert "torch imported: False" in said, said[-2000:]
    assert second["models"] == first["models"] and second["summary"]["exit_code"] == first["summary"]["exit_code"]
    flip_one_byte(copies[2] / "model_executor" / "layers" / "layernorm.py", b"import", b"imporT")
    _, said = _apply(copies[2], tmp_path / "cache")
    assert "torch imported: True" in said, "a part of the package changed: the harness runs again"


def _model(name: str, kind: EditKind, status: ModelStatus = ModelStatus.PATCHED) -> ModelResult:
    edit = EditResult(kind, "t", "interfaces.py", "EagleModelMixin", "m", EditStatus.APPLIED)
    return ModelResult(f"{name}.{name.title()}ForCausalLM", f"{name}.py", status, edits=(edit,))


def test_the_rows_are_put_together_the_same_way_from_kept_rows_or_runs() -> None:
    """proof_rows asks ``one`` per patched model (mixin and id0-only flags from its edits), skips the others, and
    applies the mixin rule; ``one`` with no row for a model means nothing is kept: no answer."""
    tree: Any = SimpleNamespace(version="0.18.0")
    models = [
        _model("llama", EditKind.VLLM_MIXIN),
        _model("gpt_oss", EditKind.VLLM_MIXIN),
        _model("mimo", EditKind.VLLM_MIXIN, ModelStatus.UNSUPPORTED),
    ]
    asked = []

    def one(label: str, path: str, mixin: bool, id0_only: bool) -> SmokeResult:
        asked.append((label, mixin, id0_only))
        status = HarnessStatus.PASS if label.startswith("llama") else HarnessStatus.ERROR
        return SmokeResult(label, path, status, "" if status == HarnessStatus.PASS else f"{UNSHOWN}: not run")

    run = proof_rows(tree, models, one)
    assert run is not None
    assert asked == [("llama.LlamaForCausalLM", True, True), ("gpt_oss.Gpt_OssForCausalLM", True, True)]
    assert [r.status for r in run.results] == [HarnessStatus.PASS, HarnessStatus.SKIPPED, HarnessStatus.SKIPPED]
    assert run.results[1].message.endswith("proven on llama.LlamaForCausalLM")
    assert proof_rows(tree, models, lambda *a: None) is None
