"""The records a run returns: frozen, rendered by :mod:`patchcraft.ui`, judged by the pipeline.

A run (:func:`patchcraft.engine.tree_run.run`) gives one :class:`RunResult` per
tree: a :class:`ModelResult` row per model class (and the tree rows,
``runner`` and ``allreduce-fusion``), each with the :class:`EditResult` of
its edit sites, and the :class:`FileChange` of every file it would write.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from patchcraft.base.sources import Source
from patchcraft.base.status import EditKind, EditStatus, HAND_MADE, HarnessStatus, ModelStatus, Proof
from patchcraft.base.target import SglangTree


class Mode(enum.Enum):
    APPLY = "apply"
    CHECK = "check"
    DIFF = "diff"
    VERIFY = "verify"
    REVERT = "revert"


@dataclass(frozen=True)
class EditResult:
    kind: EditKind
    transform: str
    file: str
    cls: str
    method: str
    status: EditStatus
    detail: str = ""


@dataclass(frozen=True)
class HarnessVerdict:
    """What the CPU harness said of one model's patched text: the record, never parsed back from a message."""

    status: HarnessStatus
    #: The harness's own words (``SCENARIO: detail``, or why it could not run).
    message: str = ""
    #: The scenario that failed or erred first (docs/harness.md), or "" (passed, or not run at all).
    scenario: str = ""
    #: What that scenario's failure means for the server, in the user's terms (``harness.scenarios.CONSEQUENCES``).
    consequence: str = ""


@dataclass(frozen=True)
class ProofVerdict:
    """One model's proof as the pipeline hands it to :func:`patchcraft.engine.tree_run.withhold`."""

    proof: Proof
    #: Why the text is withheld (its row's message says it), or "" when it is not.
    reason: str = ""
    harness: HarnessVerdict | None = None


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
    #: Whether the CPU harness ran the code (``harness-passed`` ...; see pipeline/proof.py), or None.
    proof: Proof | None = None
    #: The harness's verdict when it ran this model, or None.
    harness: HarnessVerdict | None = None

    @property
    def is_model_class(self) -> bool:
        """A model class row (``module.Class``), not a tree row such as ``runner`` or ``allreduce-fusion``."""
        return "." in self.model

    @property
    def hand_made(self) -> bool:
        """Whether any of the model's edits was made by hand (recognised as such by its transform)."""
        return any(e.status in HAND_MADE for e in self.edits)


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
