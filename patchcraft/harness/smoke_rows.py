"""Smoke rows as text lines and as GitHub annotations. No torch, no printing.

Their JSON is :func:`patchcraft.ui.documents.smoke_rows_json`; what they do to
the exit code, :func:`patchcraft.ui.machine_output.exit_code` (``smoke=``).
"""

from __future__ import annotations

from typing import Sequence

from patchcraft.harness.runner import ERROR, FAIL, PASS, SKIPPED, SmokeRun

_LABEL = {PASS: "PASS", FAIL: "FAIL", ERROR: "ERROR", SKIPPED: "skip"}


def text_lines(runs: Sequence[SmokeRun], device: str = "cpu") -> list[str]:
    """One header per target, then one row per model class: verdict, time, shape or problem."""
    lines: list[str] = []
    for run in runs:
        counts = {s: sum(r.status == s for r in run.results) for s in (PASS, FAIL, ERROR, SKIPPED)}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        lines.append(
            f"smoke ({device}) {run.tree.engine} {run.version} at {run.tree.package}: {summary or 'no model classes'}"
        )
        width = max((len(r.model) for r in run.results), default=0)
        for row in run.results:
            took = f"{row.seconds:5.2f}s" if row.status != SKIPPED else "      "
            detail = row.message if row.status != PASS else row.shape + (f"; note: {row.notes}" if row.notes else "")
            lines.append(f"  {_LABEL[row.status]:5} {row.model:{width}} {took}  {detail}")
    return lines


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
