"""str -> str: one file's text patched (or reverted) by the transforms of its edit sites.

The innermost layer of a run. It parses only the methods that hold the
sites (libcst is slow on big files), applies each site's transform, and
returns the new text with one outcome (or error) per site; it never reads
or writes a file.
"""

from __future__ import annotations

import ast

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from patchcraft import MARKER
from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.class_graph import parse_python
from patchcraft.reading.parsed import parse_cst
from patchcraft.planning.records import EditSite
from patchcraft.base.sources import Source
from patchcraft.base.status import EDIT_IN_PLACE, EditStatus

if TYPE_CHECKING:
    import libcst as cst

    from patchcraft.transforms import BY_KIND, RUNNER_TRANSFORMS, VLLM_TRANSFORMS
    from patchcraft.transforms._base import Outcome, RemoveMarked, marked_parts
    from patchcraft.transforms._contract import Transform
    from patchcraft.transforms._slices import ClassSlices, code_with_ending
else:
    # libcst and the transforms load on first use: a run answered from the
    # result cache (patchcraft.engine.result_cache) needs neither (docs/performance.md).
    from patchcraft.base.lazy import Deferred

    cst = Deferred("libcst")
    BY_KIND = Deferred("patchcraft.transforms", "BY_KIND")
    RUNNER_TRANSFORMS = Deferred("patchcraft.transforms", "RUNNER_TRANSFORMS")
    VLLM_TRANSFORMS = Deferred("patchcraft.transforms", "VLLM_TRANSFORMS")
    ClassSlices = Deferred("patchcraft.transforms._slices", "ClassSlices")
    Outcome = Deferred("patchcraft.transforms._base", "Outcome")
    RemoveMarked = Deferred("patchcraft.transforms._base", "RemoveMarked")
    marked_parts = Deferred("patchcraft.transforms._base", "marked_parts")
    code_with_ending = Deferred("patchcraft.transforms._slices", "code_with_ending")


@dataclass
class FilePatch:
    """The result of patching one file's text: new text and one outcome per site."""

    after: str
    outcomes: dict[tuple, Outcome] = field(default_factory=dict)
    errors: dict[tuple, str] = field(default_factory=dict)


def parse(text: str, path: Path) -> cst.Module:
    """Parse a whole file, or a class or method cut out of it and padded to its place
    (line numbers, in the message of a syntax error too, are then the file's)."""
    try:
        return parse_cst(text)
    except cst.ParserSyntaxError as exc:
        line, message = _python_syntax_error(text) or (exc.raw_line, exc.message)
        raise PatchcraftError(f"{path}: syntax error at line {line}: {message}; nothing was changed") from None


def _python_syntax_error(text: str) -> tuple[int | None, str] | None:
    """Python's own line and message for a text libcst rejected (libcst's raw_line can be one past it)."""
    try:
        ast.parse(text)
    except SyntaxError as exc:
        return exc.lineno, exc.msg
    return None


def _slices(text: str, path: Path, cut: Callable[..., ClassSlices | None], wanted: Iterable) -> ClassSlices | None:
    """``cut(text, wanted, parse)``: ClassSlices.of (class names) or .of_methods ((class, method) pairs)."""
    try:
        return cut(text, wanted, lambda segment, first: parse(segment, path))
    except SyntaxError as exc:
        raise PatchcraftError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}; nothing was changed") from None


def patch_text(
    text: str, path: Path, sites: Sequence[EditSite], transforms: Mapping[str, Transform] | None = None
) -> FilePatch:
    """Apply the transform of each site (``transforms[site.kind]``, the model transforms
    by default) to ``text``. Errors are recorded per site.

    Only the methods holding the sites are parsed, each with its class
    header (big files are slow in libcst); when a method is missing, defined
    twice or nested in a statement, its whole class is, and when a class is
    missing or defined twice, the whole module is, so that the transform
    reports the anchor problem itself.
    """
    transforms = BY_KIND if transforms is None else transforms
    slices = _slices(text, path, ClassSlices.of_methods, [(site.cls, site.method) for site in sites])
    modules = slices.modules if slices is not None else {None: parse(text, path)}
    patch = FilePatch(after=text)
    for site in sites:
        key = slices.key(site.cls, site.method) if slices is not None else None
        try:
            modules[key], outcome = transforms[site.kind].apply(modules[key], site)
        except PatchcraftError as exc:
            patch.errors[site.key] = str(exc)
            continue
        patch.outcomes[site.key] = outcome
        if outcome.status == EditStatus.MODIFIED:
            patch.errors[site.key] = (
                f"{site.path}: {site.cls}.{site.method}: {outcome.detail}; "
                "fix or remove that block by hand, then re-run (file left untouched)"
            )
    if not patch.errors and all(o.status in EDIT_IN_PLACE for o in patch.outcomes.values()):
        patch.after = text  # nothing was edited: libcst would print the same text back, slowly
    else:
        patch.after = slices.text() if slices is not None else code_with_ending(modules[None], text)
    return patch


def revert_text(text: str, path: Path) -> str:
    """Remove every statement patchcraft inserted; the inverse of ``apply``."""
    try:
        parts = marked_parts(text)
    except SyntaxError:
        parts = None  # parse() below reports it
    if parts == []:
        return text  # no patchcraft text at all
    # Only the marked methods are parsed (a class whose marks lie outside its methods: whole).
    slices = _slices(text, path, ClassSlices.of_methods, parts) if parts else None
    if slices is None:
        return code_with_ending(_revert_module(parse(text, path), text), text)
    for name, module in slices.modules.items():
        slices.modules[name] = _revert_module(module, slices.segment(name))
    return slices.text()


def _revert_module(module: cst.Module, text: str) -> cst.Module:
    remover = RemoveMarked()
    module = module.visit(remover)
    if text.count(MARKER) > remover.removed_markers:
        # Marker text outside the removed statements: calls whose arguments patchcraft changed (the runner's),
        # a test patchcraft guarded (vLLM's capture).
        for transform in (*RUNNER_TRANSFORMS, *VLLM_TRANSFORMS):
            module = transform.revert(module)
    return module


@functools.lru_cache(maxsize=64)  # a file shared by several models is compiled once
def compiles(source: Source) -> bool:
    """Whether the file compiles: its ``ast`` tree, parsed once for planning, is compiled."""
    try:
        compile(parse_python(source.text), str(source.path), "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False
