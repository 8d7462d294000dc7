"""One file against its pristine text: pristine, patchcraft-patched only, or edited by hand.

patchcraft's own edits carry its marker and :func:`patchcraft.engine.file_patch.revert_text`
removes them exactly; what is left that differs from the pristine text
(:mod:`patchcraft.base.pristine`) was edited by hand. That hand diff is split
into hunks (``difflib``, no context lines, so each hunk is as small as it
can be), and each hunk is judged where patchcraft judges edits: by its
transforms, at the plan's edit sites. A hunk is *at an edit site* when it
lies inside the site's method and, put alone on the pristine text, it
changes what the site's transform finds there (the flag line makes the
``init`` site hand-applied; an edit elsewhere in ``forward`` changes
nothing). Only a file whose every hunk is at an edit site may be restored
and patched afresh (``apply --replace-hand-edits``).
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.planning.records import EditSite
from patchcraft.engine.file_patch import patch_text, revert_text
from patchcraft.base.pristine import Pristine
from patchcraft.base.status import FileState


@dataclass(frozen=True)
class Hunk:
    """One hand-made change: its lines in the file as it is (patchcraft's own edits taken out)."""

    first: int
    #: The last line; ``first - 1`` when the hunk only removed lines.
    last: int
    #: ``Class.method`` holding it, or ``module level``.
    where: str
    #: The kind of the edit site it sits at (``init``, ``setter``, ``forward``), or None: at none.
    site: str | None
    #: The hunk's removed (``-``) and added (``+``) lines.
    lines: tuple[str, ...] = ()

    def label(self, rel: str) -> str:
        if self.last < self.first:
            span = f"after line {self.first - 1} (lines removed)"
        else:
            span = f"{self.first}" if self.last == self.first else f"{self.first}-{self.last}"
        return f"{Path(rel).name}:{span} ({self.where})"


@dataclass(frozen=True)
class FileReport:
    """What one file is against its pristine text (docs/json.md, ``files``)."""

    rel: str
    path: Path
    state: FileState
    #: Where the pristine text came from (``RECORD``, ``git HEAD``, ``wheel ...``), or why none could be had.
    origin: str
    #: The hand diff against the pristine text (``a/``: pristine, ``b/``: the file, patchcraft's edits taken out).
    diff: str = ""
    hunks: tuple[Hunk, ...] = ()
    pristine: str | None = field(default=None, repr=False, compare=False)

    @property
    def others(self) -> tuple[Hunk, ...]:
        """The hand hunks at no patchcraft edit site: what a replace would drop without understanding."""
        return tuple(h for h in self.hunks if h.site is None)

    @property
    def replaceable(self) -> bool:
        return self.state == FileState.HAND and self.pristine is not None and not self.others


def classify(
    path: Path, rel: str, current: str, pristine: Pristine, sites: Callable[[], Sequence[EditSite]]
) -> FileReport:
    """Judge ``current`` (the file's text now) against ``pristine``, at the edit sites ``sites()`` gives.

    ``sites`` is called only for a file edited by hand: finding them plans the tree.
    """
    if pristine.text is None:
        return FileReport(rel, path, FileState.UNKNOWN, pristine.origin)
    if current == pristine.text:
        return FileReport(rel, path, FileState.PRISTINE, pristine.origin, pristine=pristine.text)
    hand = revert_text(current, path)
    if hand == pristine.text:
        return FileReport(rel, path, FileState.PATCHED, pristine.origin, pristine=pristine.text)
    diff = "".join(difflib.unified_diff(_lines(pristine.text), _lines(hand), f"a/{rel}", f"b/{rel}", n=3))
    hunks = _hunks(path, pristine.text, hand, [s for s in sites() if s.path == path])
    return FileReport(rel, path, FileState.HAND, pristine.origin, diff, hunks, pristine.text)


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def _hunks(path: Path, pristine: str, hand: str, sites: Sequence[EditSite]) -> tuple[Hunk, ...]:
    before, after = pristine.splitlines(keepends=True), hand.splitlines(keepends=True)
    methods = _methods(pristine)
    hand_methods: list[tuple[str, str, int, int]] | None = None
    baseline = _site_outcomes(pristine, path, sites)
    found = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        where = _enclosing(methods, i1, i2)
        if where is None and j2 > j1:  # lines added at a method's end: only the hand text shows whose body holds them
            hand_methods = _methods(hand, strict=False) if hand_methods is None else hand_methods
            where = _holding(hand_methods, after, j1, j2)
        alone = "".join(before[:i1] + after[j1:j2] + before[i2:])
        site = _site_of(where, alone, path, sites, baseline)
        lines = tuple("-" + s for s in before[i1:i2]) + tuple("+" + s for s in after[j1:j2])
        found.append(Hunk(j1 + 1, j2, ".".join(where) if where else "module level", site, lines))
    return tuple(found)


def _methods(text: str, strict: bool = True) -> list[tuple[str, str, int, int]]:
    """(class, method, first line, last line) of every method of every top-level class.

    ``strict=False``: a text that does not parse (a hand edit can break it) has none.
    """
    spans = []
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError):
        if strict:
            raise
        return []
    for node in body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.end_lineno is not None:
                    first = min([item.lineno, *(d.lineno for d in item.decorator_list)])
                    spans.append((node.name, item.name, first, item.end_lineno))
    return spans


def _enclosing(methods: Sequence[tuple[str, str, int, int]], i1: int, i2: int) -> tuple[str, str] | None:
    """The method whose body holds pristine lines ``[i1, i2)`` (0-based), or, for an insertion, both neighbours.

    An insertion lies between pristine lines ``i1`` and ``i1 + 1`` (1-based): inside a method when the
    method holds both, its ``def`` line included (lines added at the top of the body).
    """
    if i2 == i1:
        before, after = i1, i1 + 1
        for cls, name, start, end in methods:
            if start <= before and after <= end:
                return cls, name
        return None
    for cls, name, start, end in methods:
        if start < i1 + 1 and i2 <= end:
            return cls, name
    return None


def _holding(
    methods: Sequence[tuple[str, str, int, int]], lines: Sequence[str], j1: int, j2: int
) -> tuple[str, str] | None:
    """The method of the hand text whose body holds its lines ``[j1, j2)`` (0-based) that are not blank.

    A body ends where the code is dedented to its ``def`` again: comments and blank lines after its
    last statement, indented as the body, are the method's.
    """
    written = [j + 1 for j in range(j1, j2) if lines[j].strip()]
    if not written:
        return None
    for cls, name, start, end in methods:
        indent = _indent(lines[start - 1])
        while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
            end += 1
        if start < written[0] and written[-1] <= end:
            return cls, name
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _site_outcomes(text: str, path: Path, sites: Sequence[EditSite]) -> dict[tuple, str]:
    """What each site's transform finds in ``text`` (its status, or the error)."""
    try:
        patch = patch_text(text, path, sites)
    except PatchcraftError as exc:
        return {site.key: f"error: {exc}" for site in sites}
    return {
        site.key: str(patch.outcomes[site.key].status)
        if site.key in patch.outcomes
        else f"error: {patch.errors.get(site.key)}"
        for site in sites
    }


def _site_of(
    where: tuple[str, str] | None, alone: str, path: Path, sites: Sequence[EditSite], baseline: dict[tuple, str]
) -> str | None:
    """The kind of the site this hunk is an edit at: in its method, and seen there by its transform."""
    if where is None:
        return None
    here = [s for s in sites if (s.cls, s.method) == where]
    if not here:
        return None
    outcomes = _site_outcomes(alone, path, here)
    changed = [s for s in here if outcomes[s.key] != baseline[s.key] and not outcomes[s.key].startswith("error")]
    return changed[0].kind if changed else None
