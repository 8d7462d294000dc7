"""documents.py: the JSON documents of check-draft, explain, smoke, the GPU smoke, list, cache prune and overlay build.

Built from records made here (or, for check-draft and explain, from a real
release), checked for their keys in the order they are printed, the one
schema version, and the exit code machine_output decides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import release_package
from drafts import LAYERS, kimi_target, sglang_draft
from patchcraft import __version__
from patchcraft.analysis.draft_check import check_draft
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.analysis.target_model import load_model
from patchcraft.analysis.training import parse_training
from patchcraft.base.status import HarnessStatus, Proof
from patchcraft.base.target import SglangTree, resolve_target
from patchcraft.engine.records import Mode, ModelResult, RunResult
from patchcraft.harness.gpu_summary import Check, CudaSmokeSummary, engine_failure
from patchcraft.harness.runner import SmokeResult, SmokeRun
from patchcraft.harness.scenarios import Check as ScenarioCheck
from patchcraft.overlay.build import Overlay
from patchcraft.transforms import MODEL_TRANSFORMS
from patchcraft.ui import documents
from patchcraft.ui.machine_output import SCHEMA_VERSION

TREE = SglangTree(package=Path("/nowhere/sglang"), root=Path("/nowhere"))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):
    """check-draft's report for the Kimi-K2.5 mismatch on 0.5.10 (ids 2, 30, 58; trained on hs 0, 3, 31)."""
    root = tmp_path_factory.mktemp("kimi")
    model = load_model(resolve_target(str(release_package("0.5.10"))), "kimi_k25")
    draft = read_draft(sglang_draft(root / "draft", [2, 30, 58]))
    target = read_target(kimi_target(root / "target"))
    return check_draft(model, draft, target, parse_training("hf:0,3,31"), LAYERS, cuda_graph=False)


def test_check_draft_document(report) -> None:
    document = documents.check_draft_json(report, 1)
    assert list(document) == [
        "schema",
        "patchcraft",
        "command",
        "draft",
        "target",
        "trained_on",
        "checks",
        "verdict",
        "suggested_ids",
        "suggested_after_apply",
        "suggestion",
        "fixes",
        "blocked",
        "training_notes",
        "explain",
        "exit_code",
    ]
    assert document["schema"] == document["explain"]["schema"] == SCHEMA_VERSION
    assert (document["patchcraft"], document["command"], document["exit_code"]) == (__version__, "check-draft", 1)
    assert document["explain"]["command"] == "explain" and document["explain"]["exit_code"] == 1
    assert document["trained_on"]["hs"] == [0, 3, 31] and document["suggested_ids"] == [-1, 2, 30]
    json.dumps(document)  # plain JSON all through


def test_explain_document(report) -> None:
    """``explain --format json`` is built here alone (commands/explain.py renders it): its fields, in order."""
    document = documents.explanation_json(report.explanation, 1)
    assert list(document) == [
        "schema",
        "patchcraft",
        "command",
        "sglang_version",
        "package",
        "model",
        "num_layers",
        "setter_calls",
        "variant",
        "rule",
        "patched",
        "install",
        "layer_ids",
        "layers_to_capture",
        "embedding",
        "ids",
        "served",
        "served_source",
        "run",
        "static_served",
        "static_unknown",
        "default_served",
        "not_run",
        "id_source",
        "allreduce_fusion",
        "fusion_cost",
        "cuda_graph_resets",
        "warnings",
        "notes",
        "exit_code",
    ]
    assert (document["schema"], document["command"], document["exit_code"]) == (SCHEMA_VERSION, "explain", 1)
    assert [row["id"] for row in document["ids"]] == list(report.explanation.layer_ids or ())
    assert all(set(w) == {"kind", "message"} for w in document["warnings"])
    assert document["id_source"]["kind"] == "eagle-config" and document["fusion_cost"] is None  # TP 1
    json.dumps(document)


def _run(*rows: SmokeResult) -> SmokeRun:
    return SmokeRun(TREE, "0.5.10", rows)


ROWS = (
    SmokeResult(
        "llama.LlamaForCausalLM",
        "sglang/srt/models/llama.py",
        HarnessStatus.PASS,
        "all scenarios pass",
        (ScenarioCheck("capture", HarnessStatus.PASS, "[hs0]", "a note"),),
        0.123456,
        "list, residual pair",
    ),
    SmokeResult("qwen2.Qwen2ForCausalLM", "sglang/srt/models/qwen2.py", HarnessStatus.FAIL, "captured hs[3]"),
    SmokeResult("mod.Skipped", "sglang/srt/models/mod.py", HarnessStatus.SKIPPED, "not patched"),
)


def test_smoke_document() -> None:
    document = documents.smoke_json([], [_run(*ROWS)], "cpu", 1, verify=False)
    assert document == {
        "schema": SCHEMA_VERSION,
        "command": "smoke",
        "exit_code": 1,
        "smoke": {
            "device": "cpu",
            "targets": [{"package": "/nowhere/sglang", "engine": "sglang", "sglang_version": "0.5.10"}],
            "models": [documents.smoke_row_json(row) for row in ROWS],
            "summary": {"pass": 1, "fail": 1, "error": 0, "skipped": 1},
        },
    }
    assert list(document["smoke"]["summary"]) == ["pass", "fail", "error", "skipped"]
    assert documents.smoke_row_json(ROWS[0]) == {
        "model": "llama.LlamaForCausalLM",
        "path": "sglang/srt/models/llama.py",
        "status": "pass",
        "message": "all scenarios pass",
        "shape": "list, residual pair",
        "notes": "",
        "seconds": 0.1235,
        "checks": [{"name": "capture", "status": "pass", "detail": "[hs0]", "note": "a note"}],
    }
    assert json.loads(json.dumps(document))["smoke"]["models"][1]["status"] == "fail"


def test_verify_smoke_document_is_verify_s_with_its_smoke() -> None:
    result = RunResult(
        Mode.VERIFY,
        TREE,
        "0.5.10",
        (ModelResult("llama.LlamaForCausalLM", "sglang/srt/models/llama.py", "already-patched"),),
        (),
    )
    document = documents.smoke_json([result], [_run(ROWS[0])], "cpu", 0, verify=True)
    assert list(document) == ["schema", "patchcraft", "command", "targets", "models", "summary", "smoke"]
    assert document["command"] == "verify" and document["summary"]["exit_code"] == 0
    assert document["smoke"]["summary"] == {"pass": 1, "fail": 0, "error": 0, "skipped": 0}


def test_cuda_smoke_document_of_a_failed_engine_run() -> None:
    summary = engine_failure(2, "sglang engine run timed out after 8s", "/w")
    assert documents.cuda_smoke_json(summary) == {
        "ok": False,
        "exit_code": 1,
        "tp": 2,
        "checks": [{"name": "sglang run", "ok": False, "message": "sglang engine run timed out after 8s"}],
        "work_dir": "/w",
    }
    passed = CudaSmokeSummary(1, (Check("lossless greedy output", True, "identical"),), out_dir="/o")
    assert documents.cuda_smoke_json(passed) == {
        "ok": True,
        "exit_code": 0,
        "tp": 1,
        "checks": [{"name": "lossless greedy output", "ok": True, "message": "identical"}],
        "out_dir": "/o",
    }


def test_list_document() -> None:
    matches = {t.NAME: [] for t in MODEL_TRANSFORMS}
    first = MODEL_TRANSFORMS[0]
    matches[first.NAME] = ["sglang/srt/models/llama.py:LlamaForCausalLM.set_eagle3_layers_to_capture"]
    document = documents.list_json(MODEL_TRANSFORMS, matches, ["sglang"] * len(MODEL_TRANSFORMS))
    assert [d["name"] for d in document] == [t.NAME for t in MODEL_TRANSFORMS]
    assert document[0] == {
        "name": first.NAME,
        "kind": first.KIND,
        "engine": "sglang",
        "description": first.DESCRIPTION,
        "matches": matches[first.NAME],
    }


def test_prune_and_overlay_documents() -> None:
    assert documents.prune_json([Path("/c/overlays/a")], [Path("/c/overlays/b")]) == {
        "removed": ["/c/overlays/a"],
        "in_use": ["/c/overlays/b"],
    }
    overlay = Overlay(Path("/c/overlays/x"), ("sglang.srt.models.llama",), True, proof=Proof.SKIPPED)
    assert json.dumps(documents.overlay_json(overlay)) == (
        '{"overlay": "/c/overlays/x", "modules": ["sglang.srt.models.llama"], "reused": true, '
        '"proof": "skipped (--no-smoke)"}'
    )
