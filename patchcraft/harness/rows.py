"""The harness's rows as plain records (no torch: a kept row is read, and a proof answered, without it).

:mod:`patchcraft.harness.runner` makes them by running each model class's
scenarios; :mod:`patchcraft.harness.run_cache` keeps each row by the bytes
it ran (``row_data`` and ``row_of`` turn one into JSON data and back), and
:func:`kept_rows` answers a whole proof from those kept rows when every one
of them is there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from patchcraft.base.status import HarnessStatus
from patchcraft.base.target import SglangTree

if TYPE_CHECKING:
    from patchcraft.engine.records import ModelResult

#: The run cache's kind for one model class's scenarios row.
SCENARIOS = "scenarios"


@dataclass(frozen=True)
class Check:
    """One scenario's verdict for one model class."""

    name: str
    status: HarnessStatus
    detail: str = ""
    #: Something true of the release itself, not of the patch (shown, never a failure).
    note: str = ""


@dataclass(frozen=True)
class SmokeResult:
    """One row: a model class, its verdict, the first problem, and the time taken."""

    model: str
    path: str
    status: HarnessStatus
    message: str = ""
    checks: tuple[Check, ...] = ()
    seconds: float = 0.0
    shape: str = ""
    #: Facts about the release itself that a reader should know (see :attr:`Check.note`).
    notes: str = ""

    @property
    def ok(self) -> bool:
        return self.status in (HarnessStatus.PASS, HarnessStatus.SKIPPED)

    @property
    def scenario(self) -> str:
        """The scenario that failed (or erred) first, or "" (passed, skipped, or no scenario could be set up)."""
        if self.status not in (HarnessStatus.FAIL, HarnessStatus.ERROR):
            return ""
        return next((c.name for c in self.checks if c.status == self.status), "")


@dataclass(frozen=True)
class SmokeRun:
    """The rows of one target tree."""

    tree: SglangTree
    version: str
    results: tuple[SmokeResult, ...] = ()


def row_data(row: SmokeResult) -> dict:
    """``row`` as JSON data (:func:`row_of` reads it back)."""
    return {
        "model": row.model,
        "path": row.path,
        "status": row.status.value,
        "message": row.message,
        "checks": [[c.name, c.status.value, c.detail, c.note] for c in row.checks],
        "seconds": row.seconds,
        "shape": row.shape,
        "notes": row.notes,
    }


def row_of(data: Any) -> SmokeResult:
    """The row :func:`row_data` wrote (any other shape raises)."""
    checks = tuple(Check(str(n), HarnessStatus(s), str(d), str(note)) for n, s, d, note in data["checks"])
    return SmokeResult(
        str(data["model"]),
        str(data["path"]),
        HarnessStatus(data["status"]),
        str(data["message"]),
        checks,
        float(data["seconds"]),
        str(data["shape"]),
        str(data["notes"]),
    )


def kept_rows(
    tree: SglangTree, models: Sequence["ModelResult"], texts: Optional[Mapping[Path, str]]
) -> Optional[tuple[SmokeResult, ...]]:
    """Every model's scenarios row as kept for these bytes, or None when one is not kept (the harness must run)."""
    from patchcraft.harness import run_cache

    found = []
    for model in models:
        row = run_cache.recall(SCENARIOS, tree.package, texts, (model.model, model.path), row_of)
        if row is None:
            return None
        found.append(row)
    return tuple(found)
