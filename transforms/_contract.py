"""The typed contract of a transform: what the engine, ``patchcraft list`` and the docs read from one.

A transform is a module (``transforms/<name>.py``), not a class: LibCST's
``CodemodCommand`` and Fixit's ``LintRule`` are classes with a
``DESCRIPTION`` and a visitor, ours are module-level names and plain
functions over a parsed module. These protocols say which names, so that
mypy checks every module in the registries of :mod:`patchcraft.transforms`
(a module satisfies a protocol when it is assigned to a variable of that
type); a transform missing ``apply``, or with another signature, fails
``mypy``.

Each transform's before/after examples live beside it, in
``transforms/examples/<name>.py`` (:class:`TransformExamples`): they import
the transform, never the other way round, so a run never loads them.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import libcst as cst

from patchcraft.planning.records import EditSite
from ._base import Example, Outcome  # relative: resolved by mypy (see __init__)


class Transform(Protocol):
    """One edit site's transform (``transforms[site.kind]`` in ``engine.file_patch.patch_text``)."""

    @property
    def NAME(self) -> str:
        """The module's name, as reported in each edit row and in ``patchcraft list``."""

    @property
    def KIND(self) -> str:
        """The edit site it handles: ``EditSite.kind`` (``init``, ``setter``, ``forward``, ...)."""

    @property
    def DESCRIPTION(self) -> str:
        """One paragraph for ``patchcraft list`` and docs/transforms.md."""

    def apply(self, module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
        """The module with ``site`` edited (or recognised as done), and what was found there.

        Idempotent; an anchor problem raises ``AnchorError`` and edits nothing.
        """


class RunnerTransform(Transform, Protocol):
    """A transform that also changes calls in place (not only marked statements): it undoes them itself."""

    def revert(self, module: cst.Module) -> cst.Module:
        """The module without this transform's in-place changes (``RemoveMarked`` removes the rest)."""


class TransformExamples(Protocol):
    """``transforms/examples/<name>.py``: a transform's own before/after pairs (unit tests and docs)."""

    @property
    def TRANSFORM(self) -> Transform:
        """The transform the examples are of (as LibCST's ``CodemodTest.TRANSFORM``)."""

    @property
    def EXAMPLES(self) -> Sequence[Example]:
        """In docs order; at least one changes its input."""
