"""What to tell a user whose hand fix patchcraft refuses: the lines, the consequence, the command.

Every refusal of a hand fix names three things (docs/troubleshooting.md,
"I patched it by hand"): the hand-made lines (from the hand diff's hunks
when the pristine text is known, else the edit sites the transforms found
hand-made), what goes wrong in the user's terms (the consequence the
harness verdict records, or the static verdict), and the one command
that fixes it. Pure text from records: it never prints.

The command is one that succeeds on that file, with the run's own scope
(``--model``, ``--no-runner``, ``--no-fusion-fix``: :class:`Scope`):
``apply --replace-hand-edits`` only where it will not refuse the file (a
pristine text is known and every hand edit sits at an edit site); hand
edits elsewhere are named to undo first, and a file with no pristine text
is put back first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from patchcraft.engine.hand_edits import FileReport
from patchcraft.engine.records import ModelResult
from patchcraft.base.status import HAND_MADE, EditStatus, FileState, EditKind
from patchcraft.base.target import SglangTree
from patchcraft.base.tree_version import VersionSource


@dataclass(frozen=True)
class Scope:
    """The run's own options that an advised command repeats, so it patches what the user asked for."""

    models: tuple[str, ...] = ()
    runner: bool = True
    fusion: bool = True

    @classmethod
    def of(cls, models: Sequence[str] = (), runner: bool = True, fusion: bool = True) -> "Scope":
        return cls(tuple(models), runner, fusion)

    @property
    def flags(self) -> str:
        """``--model deepseek_v2 --no-runner`` (with a trailing space), or ""."""
        words = [f"--model {name}" for name in self.models]
        words += [] if self.runner else ["--no-runner"]
        words += [] if self.fusion else ["--no-fusion-fix"]
        return "".join(f"{w} " for w in words)


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


def _reinstall(tree: SglangTree) -> str:
    """Where the shipped files come back from: pip for a release its version file names, else the tree's own source."""
    version = tree.version_info
    if version.source is VersionSource.FILE and not version.misleads:
        return f"pip install --force-reinstall --no-deps sglang=={version.version}, or git checkout"
    closest = f"; closest release {version.closest_release}" if version.closest_release else ""
    if version.misleads:  # the version file names a build the files are not: reinstalling it would not give them back
        return (
            f"git checkout, or copy them from the source of this tree: its version file says {version.version}, "
            f"but its files are not that release's{closest}"
        )
    return f"git checkout, or copy them from the source of this tree: no version file names a release to reinstall{closest}"


def command(tree: SglangTree, model: ModelResult, reports: Mapping[str, FileReport], scope: Scope = Scope()) -> str:
    """What turns the hand fix into a proven, revertible patchcraft install: ``run: COMMAND``, with what comes first.

    ``apply --replace-hand-edits`` refuses a file with no pristine text, or
    with hand edits at no patchcraft edit site
    (:func:`patchcraft.pipeline.hand_review.replacements`): it is named only
    once those are dealt with.
    """
    by_hand = sorted({e.file for e in model.edits if e.status in HAND_MADE})
    unknown = [f for f in by_hand if f in reports and reports[f].state == FileState.UNKNOWN]
    if unknown:
        names = " ".join(unknown)
        return (
            f"put back the shipped {names} ({_reinstall(tree)}), then run: patchcraft apply {scope.flags}{tree.package}"
        )
    replace = f"patchcraft apply --replace-hand-edits {scope.flags}{tree.package}"
    others = [h.label(r.rel) for f in by_hand if (r := reports.get(f)) is not None for h in r.others]
    if others:
        return (
            f"first undo (or move out of the file) the hand edits at no patchcraft edit site, {', '.join(others)}: "
            f"`apply --replace-hand-edits` refuses the file while they are there; then run: {replace}"
        )
    return f"run: {replace}"


def advice(
    tree: SglangTree, model: ModelResult, what: str, reports: Mapping[str, FileReport], scope: Scope = Scope()
) -> str:
    """``hand-made LINES: WHAT; run: COMMAND``, the text every refusal of a hand fix ends with."""
    return f"hand-made {lines(model, reports)}: {what}; {command(tree, model, reports, scope)}"
