"""Unified diffs that ``git apply`` and ``patch -p1`` accept (pure, no styling)."""

from __future__ import annotations

import difflib
from typing import Iterable

from patchcraft.engine.records import FileChange


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def unified_diff(change: FileChange, context: int = 3) -> str:
    """The diff of one change, with ``a/`` and ``b/`` paths relative to the target root."""
    return "".join(
        difflib.unified_diff(
            _lines(change.before),
            _lines(change.after),
            fromfile=f"a/{change.rel}",
            tofile=f"b/{change.rel}",
            n=context,
        )
    )


def unified_diffs(changes: Iterable[FileChange]) -> str:
    return "".join(unified_diff(c) for c in changes)
