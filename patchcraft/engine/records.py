"""The records a run returns: frozen, printed by ``output``, judged by ``report``.

A run (:func:`patchcraft.engine.tree_run.run`) gives one :class:`RunResult` per
tree: a :class:`ModelResult` row per model class (and the tree rows,
``runner`` and ``allreduce-fusion``), each with the :class:`EditResult` of
its edit sites, and the :class:`FileChange` of every file it would write.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from patchcraft.base.sources import Source
from patchcraft.base.status import EditStatus, ModelStatus
from patchcraft.base.target import SglangTree


class Mode(enum.Enum):
    APPLY = "apply"
    CHECK = "check"
    DIFF = "diff"
    VERIFY = "verify"
    REVERT = "revert"


@dataclass(frozen=True)
class EditResult:
    kind: str
    transform: str
    file: str
    cls: str
    method: str
    status: EditStatus
    detail: str = ""


@dataclass(frozen=True)
class ModelResult:
    model: str
    path: str
    status: ModelStatus
    edits: tuple[EditResult, ...] = ()
    message: str = ""
    files: tuple[str, ...] = ()
    compiles: bool | None = None
    idempotent: bool | None = None
    notes: tuple[str, ...] = ()
    #: Why a model not named with ``--model`` is in the run (see :func:`patchcraft.planning.selection.select`).
    included_by: str | None = None
    #: Whether the CPU harness ran the code (``harness-passed`` ...; see commands/_proof.py), or None.
    proof: str | None = None


@dataclass(frozen=True)
class FileChange:
    source: Source
    rel: str
    after: str

    @property
    def before(self) -> str:
        return self.source.text


@dataclass(frozen=True)
class RunResult:
    mode: Mode
    tree: SglangTree
    version: str
    models: tuple[ModelResult, ...]
    changes: tuple[FileChange, ...]
