"""The CUDA smoke's result: a frozen record, and ``summary.json`` written from it.

``patchcraft.ui.console.render_cuda_smoke`` renders it as text;
``patchcraft.ui.documents.cuda_smoke_json`` is its JSON document (the
``--format json`` output, docs/smoke.md, and ``summary.json`` under
``--out``), and ``patchcraft.ui.machine_output.verdict_code`` its exit code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

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


def write_summary(
    summary: CudaSmokeSummary, out_dir: Path, document: Callable[[CudaSmokeSummary], Mapping[str, Any]]
) -> CudaSmokeSummary:
    """``out_dir/summary.json``, the ``document`` of the summary (its ``out_dir`` set); a directory that cannot be
    written is noted, and the summary still printed."""
    summary = replace(summary, out_dir=str(out_dir))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / SUMMARY_NAME).write_text(json.dumps(document(summary), indent=2, default=str) + "\n")
    except OSError as exc:
        return replace(summary, out_dir_error=f"{type(exc).__name__}: {exc}")
    return summary
