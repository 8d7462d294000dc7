"""The CUDA smoke's result: a frozen record, its JSON document and ``summary.json``.

``patchcraft.ui.console.render_cuda_smoke`` renders it as text; ``to_json`` is
the ``--format json`` document (docs/smoke.md), and ``summary.json`` under
``--out``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from patchcraft.base.errors import CHANGED, OK

from patchcraft.harness import gpu_compare as compare

SUMMARY_NAME = "summary.json"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str


@dataclass(frozen=True)
class Comparison:
    """What the engine runs showed, once both finished."""

    target: str
    draft: str
    layer_ids: Tuple[int, ...]
    reference: str  # "hf-full" or "embedding-only"
    sglang_version: Optional[str]
    sglang_file: Optional[str]
    aux: Dict[str, compare.AuxComparison]
    records_used: int
    records_skipped: Dict[str, int]
    lossless: compare.LosslessResult
    speed: Dict[str, Dict[str, Any]]  # "speculative", "baseline": compare.summarize_speculation
    engine: Dict[str, Any]  # both engines' kwargs, baseline_generate, timeout_s, allreduce_fusion

    @property
    def expected(self) -> list[str]:
        return [f"hs[{k}]" for k in compare.expected_hs_indices(self.layer_ids)]


@dataclass(frozen=True)
class CudaSmokeSummary:
    tp: int
    checks: Tuple[Check, ...]
    comparison: Optional[Comparison] = None  # None: an engine run failed before there was anything to compare
    work_dir: Optional[str] = None
    out_dir: Optional[str] = None
    out_dir_error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def exit_code(self) -> int:
        return OK if self.ok else CHANGED


def engine_failure(tp: int, message: str, work_dir: Optional[str]) -> CudaSmokeSummary:
    """An engine crashed or timed out: a failed smoke, its work directory kept for the logs."""
    return CudaSmokeSummary(tp, (Check("sglang run", False, message),), work_dir=work_dir)


def build_summary(tp: int, comparison: Comparison, work_dir: Optional[str] = None) -> CudaSmokeSummary:
    """The checks that gate the smoke: both aux phases and the lossless output."""
    checks = []
    for phase, label in (
        ("prefill", "aux hidden states, prefill"),
        ("verify", "aux hidden states, verify (CUDA graph replay)"),
    ):
        result = comparison.aux.get(phase)
        if result is None:
            checks.append(Check(label, False, "no batch of this kind was recorded"))
        else:
            checks.append(Check(f"{label}, {result.num_tokens} tokens", result.ok, result.message))
    checks.append(Check("lossless greedy output", comparison.lossless.ok, comparison.lossless.message))
    return CudaSmokeSummary(tp, tuple(checks), comparison, work_dir=work_dir)


def speed(spec_run: Dict[str, Any], base_run: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {
        "speculative": compare.summarize_speculation(spec_run.get("meta_info", []), spec_run.get("elapsed_s", 0.0)),
        "baseline": compare.summarize_speculation(base_run.get("meta_info", []), base_run.get("elapsed_s", 0.0)),
    }


def to_json(summary: CudaSmokeSummary) -> Dict[str, Any]:
    """The ``--format json`` document; key order as docs/smoke.md shows it."""
    document: Dict[str, Any] = {"ok": summary.ok, "exit_code": summary.exit_code, "tp": summary.tp}
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
            aux={phase: c.to_dict() for phase, c in result.aux.items()},
            records={"used": result.records_used, "skipped": result.records_skipped},
            lossless=result.lossless.to_dict(),
            speed=result.speed,
            engine=result.engine,
        )
    for key in ("work_dir", "out_dir", "out_dir_error"):
        value = getattr(summary, key)
        if value is not None:
            document[key] = value
    return document


def write_summary(summary: CudaSmokeSummary, out_dir: Path) -> CudaSmokeSummary:
    """``out_dir/summary.json``; a directory that cannot be written is noted, and the summary still printed."""
    summary = replace(summary, out_dir=str(out_dir))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / SUMMARY_NAME).write_text(json.dumps(to_json(summary), indent=2, default=str) + "\n")
    except OSError as exc:
        return replace(summary, out_dir_error=f"{type(exc).__name__}: {exc}")
    return summary
