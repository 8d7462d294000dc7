"""What to tell a user whose hand fix patchcraft refuses: the lines, the consequence, the command.

Every refusal of a hand fix names three things (docs/troubleshooting.md,
"I patched it by hand"): the hand-made lines (from the hand diff's hunks
when the pristine text is known, else the edit sites the transforms found
hand-made), what goes wrong in the user's terms (the consequence the
harness verdict records, or the static verdict), and the one command
that fixes it. Pure text from records: it never prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from patchcraft.engine.hand_edits import FileReport
from patchcraft.engine.records import ModelResult
from patchcraft.base.status import HAND_MADE, EditStatus, FileState, EditKind
from patchcraft.base.target import SglangTree


def missing_init(model: ModelResult) -> str | None:
    """The static verdict of a hand forward whose flag some ``__init__`` never sets, or None."""
    forward_by_hand = any(e.kind == EditKind.FORWARD and e.status == EditStatus.HAND_APPLIED for e in model.edits)
    missing = sorted({e.cls for e in model.edits if e.kind == EditKind.INIT and e.status == EditStatus.APPLIED})
    if not forward_by_hand or not missing:
        return None
    classes = ", ".join(missing)
    return f"{classes} {'inherit' if len(missing) > 1 else 'inherits'} this forward but {'their' if len(missing) > 1 else 'its'} __init__ never sets the flag: it crashes at start-up"


def lines(model: ModelResult, reports: Mapping[str, FileReport]) -> str:
    """The hand-made lines of ``model``'s files: hunks when known, else the sites found hand-made."""
    named = [h.label(r.rel) for f in sorted(model.files) if (r := reports.get(f)) is not None for h in r.hunks]
    if named:
        return ", ".join(named)
    sites = sorted({f"{Path(e.file).name} {e.cls}.{e.method}" for e in model.edits if e.status in HAND_MADE})
    return ", ".join(sites) or "none found"


def command(tree: SglangTree, model: ModelResult, reports: Mapping[str, FileReport]) -> str:
    """The one command that turns the hand fix into a proven, revertible patchcraft install."""
    by_hand = {e.file for e in model.edits if e.status in HAND_MADE}
    unknown = sorted(f for f in by_hand if f in reports and reports[f].state == FileState.UNKNOWN)
    if not unknown:
        return f"patchcraft apply --replace-hand-edits {tree.package}"
    names = " ".join(unknown)
    return f"put back the shipped {names} (pip install --force-reinstall --no-deps sglang=={tree.version}, or git checkout), then patchcraft apply {tree.package}"


def advice(tree: SglangTree, model: ModelResult, what: str, reports: Mapping[str, FileReport]) -> str:
    """``hand-made LINES: WHAT; run: COMMAND``, the text every refusal of a hand fix ends with."""
    return f"hand-made {lines(model, reports)}: {what}; run: {command(tree, model, reports)}"
