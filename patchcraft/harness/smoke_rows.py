"""Smoke rows as text lines and as JSON; the smoke part of an exit code. No torch, no printing."""

from __future__ import annotations

from typing import Any, Sequence

from patchcraft.harness.runner import ERROR, FAIL, PASS, SKIPPED, SmokeRun

_LABEL = {PASS: "PASS", FAIL: "FAIL", ERROR: "ERROR", SKIPPED: "skip"}


def failed(runs: Sequence[SmokeRun]) -> bool:
    """Whether any model class failed, or could not be run by the harness."""
    return any(row.status in (FAIL, ERROR) for run in runs for row in run.results)


def text_lines(runs: Sequence[SmokeRun], device: str = "cpu") -> list[str]:
    """One header per target, then one row per model class: verdict, time, shape or problem."""
    lines: list[str] = []
    for run in runs:
        counts = {s: sum(r.status == s for r in run.results) for s in (PASS, FAIL, ERROR, SKIPPED)}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        lines.append(f"smoke ({device}) sglang {run.version} at {run.tree.package}: {summary or 'no model classes'}")
        width = max((len(r.model) for r in run.results), default=0)
        for row in run.results:
            took = f"{row.seconds:5.2f}s" if row.status != SKIPPED else "      "
            detail = row.message if row.status != PASS else row.shape + (f"; note: {row.notes}" if row.notes else "")
            lines.append(f"  {_LABEL[row.status]:5} {row.model:{width}} {took}  {detail}")
    return lines


def row_json(row: Any) -> dict[str, Any]:
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


def to_json(runs: Sequence[SmokeRun], device: str = "cpu") -> dict[str, Any]:
    """The ``smoke`` part of a JSON document (docs/harness.md)."""
    rows = [row for run in runs for row in run.results]
    return {
        "device": device,
        "targets": [{"package": str(r.tree.package), "sglang_version": r.version} for r in runs],
        "models": [row_json(row) for row in rows],
        "summary": {s: sum(r.status == s for r in rows) for s in (PASS, FAIL, ERROR, SKIPPED)},
    }


def github_lines(runs: Sequence[SmokeRun]) -> list[str]:
    """``::error`` workflow commands for the rows that did not pass."""
    lines = []
    for run in runs:
        for row in run.results:
            if row.status in (FAIL, ERROR):
                message = row.message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
                path = str(run.tree.root / row.path).replace("%", "%25").replace(",", "%2C").replace(":", "%3A")
                lines.append(f"::error file={path},title=patchcraft smoke {row.status}::{row.model}: {message}")
    return lines
