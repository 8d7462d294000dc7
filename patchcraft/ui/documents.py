"""The JSON documents of the commands outside the pipeline, built from their records.

The pipeline's document (``apply``, ``check``, ``diff``, ``verify``,
``revert``) is :func:`patchcraft.ui.machine_output.to_json`; here are the
others: ``explain`` and ``check-draft`` (docs/layer-ids.md, docs/json.md),
``smoke`` and ``verify --smoke`` (docs/harness.md), the GPU smoke's report
(``smoke --device cuda``, and its ``summary.json``: docs/smoke.md),
``list``, ``cache prune``, ``overlay build`` and ``probe`` (docs/probe.md). Each is a plain ``dict``
(or ``list``) in the key order it is printed in; the commands render them
with :func:`patchcraft.ui.console.print_json`. A document with a
``schema`` field carries :data:`patchcraft.ui.machine_output.SCHEMA_VERSION`.
The exit codes in them are :mod:`patchcraft.ui.machine_output`'s.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from patchcraft import __version__
from patchcraft.ui.machine_output import SCHEMA_VERSION, to_json, verdict_code, version_json

if TYPE_CHECKING:  # types only: each document loads what it reads when it is built
    from patchcraft.analysis.draft_check import DraftReport
    from patchcraft.analysis.vllm_draft_check import OneConfig, VllmDraftReport
    from patchcraft.analysis.explain import Explanation
    from patchcraft.analysis.probe import ProbeReport
    from patchcraft.engine.records import RunResult
    from patchcraft.harness.gpu_summary import CudaSmokeSummary
    from patchcraft.harness.runner import SmokeResult, SmokeRun
    from patchcraft.overlay.build import Overlay
    from patchcraft.transforms._contract import Transform


# -- explain and check-draft ------------------------------------------------------------------


def explanation_json(result: Explanation, code: int) -> dict[str, Any]:
    """``explain --format json``; also the ``explain`` of a check-draft document."""
    from patchcraft.analysis.target_model import describe_state

    return {
        "schema": SCHEMA_VERSION,
        "patchcraft": __version__,
        "command": "explain",
        **version_json(result.version),
        "package": result.package,
        "model": result.model,
        "num_layers": result.num_layers,
        "setter_calls": list(result.calls),
        "variant": result.variant,
        "rule": result.rule,
        "patched": result.patched,
        "install": result.patch_detail,
        "layer_ids": list(result.layer_ids) if result.layer_ids is not None else None,
        "layers_to_capture": list(result.layers_to_capture) if result.layers_to_capture is not None else None,
        "embedding": result.embedding,
        "ids": [
            {
                "id": row.layer_id,
                "layers_to_capture": row.value,
                "hs": row.state,
                "state": describe_state(row.state) if row.state is not None else None,
                "note": row.note,
            }
            for row in result.rows
        ],
        "served": list(result.served),
        "served_source": result.source,
        "run": run_json(result),
        "static_served": None if result.static_unknown else list(result.static_served),
        "static_unknown": result.static_unknown or None,
        "default_served": list(result.default_served),
        "not_run": result.not_run or None,
        "id_source": None
        if result.id_source is None
        else {
            "kind": str(result.id_source.kind),
            "field": result.id_source.field or None,
            "read_at": result.id_source.read_at or None,
            "call": result.id_source.call or None,
        },
        "allreduce_fusion": result.allreduce_fusion,
        "fusion_cost": None
        if result.fusion_cost is None
        else {
            "layers": list(result.fusion_cost.layers),
            "all_layers": result.fusion_cost.all_layers,
            "text": result.fusion_cost.text,
        },
        "cuda_graph_resets": [r.where for r in result.resets],
        "warnings": [{"kind": w.kind, "message": w.message} for w in result.warnings],
        "notes": list(result.notes),
        "exit_code": code,
    }


def run_json(result: Explanation) -> dict[str, Any] | None:
    """The harness run of an explanation: each state fed and whether it is a copy, or the crash (null when static)."""
    outcome = result.outcome
    if outcome is None:
        return None
    return {
        "fed": [{"hs": f.state, "copy": f.copy, "what": f.what} for f in outcome.fed],
        "crash": outcome.crash or None,
        "crash_in": outcome.stage or None,
    }


def check_draft_json(report: DraftReport, code: int) -> dict[str, Any]:
    """``check-draft --format json``: the draft, the target, the training states, the checks and every fix."""
    draft = report.draft
    return {
        "schema": SCHEMA_VERSION,
        "patchcraft": __version__,
        "command": "check-draft",
        "draft": {
            "config": str(draft.path),
            "layer_ids": list(draft.layer_ids) if draft.layer_ids is not None else None,
            "speculators_ids": list(draft.speculators_ids) if draft.speculators_ids is not None else None,
            "top_level_ids": list(draft.top_level_ids) if draft.top_level_ids is not None else None,
            "target_hidden_size": draft.target_hidden_size,
            "fc_in": draft.fc_in,
            "fc_source": draft.fc_source,
        },
        "target": None
        if report.target is None
        else {
            "config": str(report.target.path),
            "num_layers": report.target.num_layers,
            "hidden_size": report.target.hidden_size,
        },
        "trained_on": None
        if report.expected is None
        else {"hs": list(report.expected.states), "how": report.expected.how, "problem": report.expected.problem},
        "checks": [{"name": c.name, "ok": c.ok, "message": c.message} for c in report.checks],
        "verdict": report.verdict,
        "suggested_ids": list(report.suggestion.ids) if report.suggestion else None,
        "suggested_after_apply": report.suggestion.after_apply if report.suggestion else None,
        "suggestion": report.suggestion_text,
        "fixes": [
            {
                "ids": list(f.ids),
                "after_apply": f.after_apply,
                "proof": f.proof,
                "flags": list(f.flags),
                "trained_on": f.trained_on or None,
                "rule": f.rule,
                "same_on_every_release": f.portable,
            }
            for f in report.fixes
        ],
        "blocked": [{"way": b.way, "why": b.why, "others": b.others} for b in report.blocked],
        "training_notes": list(report.training_notes),
        "explain": explanation_json(report.explanation, code),
        "exit_code": code,
    }


def check_draft_engines_json(
    sglang: DraftReport | None,
    vllm: VllmDraftReport,
    both: OneConfig | None,
    codes: Mapping[str, int | None],
    vllm_where: str,
    code: int,
) -> dict[str, Any]:
    """``check-draft --engine sglang,vllm --format json`` (or ``--engine vllm``): each engine's document, and the
    one config for both; ``exit_code`` is 0 only when every engine asked passes."""
    return {
        "schema": SCHEMA_VERSION,
        "patchcraft": __version__,
        "command": "check-draft",
        "engines": (["sglang"] if sglang is not None else []) + ["vllm"],
        "sglang": check_draft_json(sglang, codes["sglang"] or 0) if sglang is not None else None,
        "vllm": vllm_check_draft_json(vllm, codes["vllm"] or 0, vllm_where),
        "one_config": None if both is None else one_config_json(both),
        "exit_code": code,
    }


def vllm_check_draft_json(report: VllmDraftReport, code: int, vllm_where: str) -> dict[str, Any]:
    """vLLM's half of a check-draft document: the ids its default runner reads, the checks, every proven fix."""
    from patchcraft.ui.vllm_explain_text import vllm_explanation_json

    return {
        "engine": "vllm",
        "version": report.explanation.version,
        "tree": vllm_where,
        "ids": list(report.ids) if report.ids is not None else None,
        "read_from": report.read_from or None,
        "trained_on": None
        if report.expected is None
        else {"hs": list(report.expected.states), "how": report.expected.how, "problem": report.expected.problem},
        "checks": [{"name": c.name, "ok": c.ok, "message": c.message} for c in report.checks],
        "verdict": report.verdict,
        "fixes": [
            {
                "field": "eagle_aux_hidden_state_layer_ids",
                "ids": list(f.ids),
                "after_apply": f.after_apply,
                "apply_model": f.apply_model if f.after_apply else None,
                "proof": "run",
                "fed": f.fed,
                "trained_on": f.trained_on or None,
            }
            for f in report.fixes
        ],
        "blocked": [{"way": b.way, "why": b.why, "others": b.others} for b in report.blocked],
        "apply_not_tried": report.apply_note or None,
        "explain": vllm_explanation_json(report.explanation, code),
        "exit_code": code,
    }


def one_config_json(both: OneConfig) -> dict[str, Any]:
    return {
        "sglang": {
            "field": "eagle_config.eagle_aux_hidden_state_layer_ids",
            "ids": list(both.sglang_ids) if both.sglang_ids is not None else None,
            "after_apply": both.sglang_after_apply,
            "flags": list(both.sglang_flags),
        },
        "vllm": {
            "field": "eagle_aux_hidden_state_layer_ids",
            "ids": list(both.vllm_ids) if both.vllm_ids is not None else None,
            "after_apply": both.vllm_after_apply,
            "apply_model": both.vllm_model or None,
        },
        "ok": both.ok,
        "why": both.why or None,
    }


# -- the CPU harness: smoke, verify --smoke ---------------------------------------------------


def smoke_json(results: Sequence[RunResult], runs: Sequence[SmokeRun], label: str, code: int, verify: bool) -> dict:
    """``smoke --format json`` (``verify``: ``verify --smoke``, the verify document with its ``smoke``)."""
    document = to_json(results, code) if verify else {"schema": SCHEMA_VERSION, "command": "smoke", "exit_code": code}
    document["smoke"] = smoke_rows_json(runs, label)
    return document


def smoke_rows_json(runs: Sequence[SmokeRun], device: str = "cpu") -> dict[str, Any]:
    """The ``smoke`` part of a document (docs/harness.md): one row per model class, and the count per status."""
    from patchcraft.harness.runner import ERROR, FAIL, PASS, SKIPPED

    rows = [row for run in runs for row in run.results]
    return {
        "device": device,
        "targets": [{"package": str(r.tree.package), "engine": r.tree.engine, **version_json(r.version)} for r in runs],
        "models": [smoke_row_json(row) for row in rows],
        "summary": {s: sum(r.status == s for r in rows) for s in (PASS, FAIL, ERROR, SKIPPED)},
    }


def smoke_row_json(row: SmokeResult) -> dict[str, Any]:
    return {
        "model": row.model,
        "path": row.path,
        "status": row.status,
        "message": row.message,
        "shape": row.shape,
        "notes": row.notes,
        "seconds": round(row.seconds, 4),
        "checks": [{"name": c.name, "status": c.status, "detail": c.detail, "note": c.note} for c in row.checks],
    }


# -- the GPU smoke ----------------------------------------------------------------------------


def cuda_smoke_json(summary: CudaSmokeSummary) -> dict[str, Any]:
    """``smoke --device cuda --format json``, and ``summary.json`` under ``--out``; key order as docs/smoke.md shows it."""
    document: dict[str, Any] = {"ok": summary.ok, "exit_code": verdict_code(summary.ok), "tp": summary.tp}
    result = summary.comparison
    if result is not None:
        document.update(
            target=result.target,
            draft=result.draft,
            layer_ids=list(result.layer_ids),
            expected=result.expected,
            reference=result.reference,
            sglang={"version": result.sglang_version, "file": result.sglang_file},
        )
    document["checks"] = [asdict(check) for check in summary.checks]
    if result is not None:
        document.update(
            aux={phase: asdict(c) for phase, c in result.aux.items()},
            records={"used": result.records_used, "skipped": result.records_skipped},
            lossless=asdict(result.lossless),
            speed=result.speed,
            engine=result.engine,
        )
    for key in ("work_dir", "out_dir", "out_dir_error"):
        value = getattr(summary, key)
        if value is not None:
            document[key] = value
    return document


# -- list, cache prune, overlay build ---------------------------------------------------------


def list_json(
    transforms: Sequence[Transform], matches: Mapping[str, Sequence[str]], engines: Sequence[str]
) -> list[dict[str, Any]]:
    """``list --format json``: each transform, its engine (``engines``, in the same order), and the sites it
    matches in the targets (``matches``, by name)."""
    return [
        {"name": t.NAME, "kind": t.KIND, "engine": e, "description": t.DESCRIPTION, "matches": list(matches[t.NAME])}
        for t, e in zip(transforms, engines)
    ]


def prune_json(removed: Sequence[Path], in_use: Sequence[Path]) -> dict[str, Any]:
    """``cache prune --format json``: the directories removed, and those kept because a process uses them."""
    return {"removed": [str(p) for p in removed], "in_use": [str(p) for p in in_use]}


def overlay_json(overlay: Overlay) -> dict[str, Any]:
    """``overlay build --format json``: where the overlay is, its patched modules, whether it was reused, its proof."""
    return {
        "overlay": str(overlay.directory),
        "modules": list(overlay.modules),
        "reused": overlay.reused,
        "proof": overlay.proof,
    }


# -- probe ----------------------------------------------------------------------------------------


def probe_json(report: ProbeReport, code: int) -> dict[str, Any]:
    """``probe --format json``: the dump, every wiring measured (best first), the best, and the served one's rank."""

    def score(found: Any) -> dict[str, Any]:
        return {"states": list(found.states), "tokens": found.tokens, "top1": found.top1, "topk": found.topk}

    served = report.served
    return {
        "schema": SCHEMA_VERSION,
        "patchcraft": __version__,
        "command": "probe",
        "exit_code": code,
        "draft": str(report.draft),
        "engine": report.engine,
        "version": report.version,
        "draft_code": str(report.draft_code),
        "data": {
            "path": str(report.dump.path),
            "format": report.dump.format,
            "files": len(report.dump.files),
            "states": list(report.dump.states),
            "named_by": report.dump.named_by,
            "hidden_size": report.dump.hidden_size,
        },
        "embedding": report.embedding,
        "tokens": report.tokens,
        "top_k": report.top_k,
        "wirings": report.wirings,
        "best": {**score(report.best), "margin": report.margin},
        "served": None
        if served is None
        else {
            "states": list(served.states),
            "how": served.how,
            "score": score(served.score) if served.score is not None else None,
            "rank": served.rank,
            "missing": list(served.missing),
            "problem": served.problem,
        },
        "scores": [score(s) for s in report.scores],
    }
