"""Exit codes and the stable JSON schema: the one place that decides them.

0: clean, or done. 1: would change, not patched, or not verified.
2: usage or environment error (target not found, anchor missing or
ambiguous, syntax error, unwritable file). 130: interrupted. 3: a bug.
"""

from __future__ import annotations

from typing import Any, Sequence

from patchcraft import __version__
from patchcraft.engine import ALREADY, ERROR, UNSUPPORTED, WOULD, Mode, ModelResult, RunResult

from patchcraft.engine import NOT_NEEDED  # noqa: E402  (the runner row on a release without the defect)

OK, CHANGED, USAGE, BUG, INTERRUPTED = 0, 1, 2, 3, 130
SCHEMA_VERSION = 1


def exit_code(results: Sequence[RunResult], explicit: bool = False) -> int:
    """The exit code for one command over all its targets."""
    models = [m for r in results for m in r.models]
    if any(m.status == ERROR for m in models) or any(r.errors for r in results):
        return USAGE
    mode = results[0].mode if results else Mode.VERIFY
    if mode is Mode.CHECK and any(m.status == WOULD for m in models):
        return CHANGED
    if mode is Mode.VERIFY and any(not verified(m) for m in models):
        return CHANGED
    if mode is Mode.APPLY and explicit and any(m.status == UNSUPPORTED for m in models):
        return CHANGED
    return OK


def verified(model: ModelResult) -> bool:
    return model.status in (ALREADY, NOT_NEEDED) and model.compiles is not False


def model_json(model: ModelResult) -> dict[str, Any]:
    return {
        "path": model.path,
        "model": model.model,
        "status": model.status,
        "edits": [
            {
                "kind": e.kind,
                "transform": e.transform,
                "file": e.file,
                "class": e.cls,
                "method": e.method,
                "status": e.status,
                "detail": e.detail,
            }
            for e in model.edits
        ],
        "files": list(model.files),
        "compiles": model.compiles,
        "idempotent": model.idempotent,
        "notes": list(model.notes),
        "message": model.message,
    }


def summary(results: Sequence[RunResult], code: int) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for result in results:
        for model in result.models:
            counts[model.status] = counts.get(model.status, 0) + 1
    return {
        "models": sum(counts.values()),
        "by_status": dict(sorted(counts.items())),
        "files_changed": sum(len(r.changes) for r in results),
        "exit_code": code,
    }


def to_json(results: Sequence[RunResult], code: int) -> dict[str, Any]:
    """The document printed by ``--format json`` (documented in docs/json.md)."""
    return {
        "schema": SCHEMA_VERSION,
        "patchcraft": __version__,
        "command": results[0].mode.value if results else None,
        "targets": [
            {"root": str(r.tree.root), "package": str(r.tree.package), "sglang_version": r.version}
            for r in results
        ],
        "models": [model_json(m) for r in results for m in r.models],
        "summary": summary(results, code),
    }
