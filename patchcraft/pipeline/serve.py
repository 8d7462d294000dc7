"""Serve the patch without touching the install: the pipeline's apply, judged exactly as ``apply``, into an overlay.

``overlay build``, ``patchcraft run`` and the GPU smoke build their overlay
here. The tree goes through the same stages as ``apply`` (hand edits judged
against the pristine text, the harness proof, withholding, the advice for
a refused hand fix); what ``apply`` would not write makes the overlay
refuse, naming the model and its row's words, before anything is written.
A cache entry that is owned, intact, current (and proven, when asked) is
served as it is, without running the stages (:func:`patchcraft.overlay.build.build`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.status import WITHHELD, ModelStatus
from patchcraft.base.target import SglangTree
from patchcraft.engine.records import Mode, RunResult
from patchcraft.overlay.build import Overlay, build
from patchcraft.pipeline import proof
from patchcraft.pipeline.stages import HandEdits, default_jobs, judge_and_write


class Refused(PatchcraftError):
    """The overlay was not built: a model ``apply`` would withhold, or cannot patch. Carries what was judged."""

    def __init__(self, message: str, result: RunResult, hand: HandEdits) -> None:
        super().__init__(message)
        self.result = result
        self.hand = hand


def refusals(result: RunResult) -> list[str]:
    """The rows that keep an overlay from being built: an ``error``, or a text the harness withheld."""
    return [m.model for m in result.models if m.status == ModelStatus.ERROR or m.proof in WITHHELD]


def build_overlay(
    tree: SglangTree,
    out: Path | None = None,
    names: Sequence[str] = (),
    runner: bool = True,
    smoke: bool = True,
    require_proof: bool = False,
) -> Overlay:
    """The overlay of ``tree`` (``out``, or the cache's, reused when it may be): :class:`Refused` when apply would
    withhold or fail a model."""

    def judged() -> RunResult:
        results, hand = judge_and_write(
            [tree], Mode.APPLY, names, runner, default_jobs(), proof.gate("apply", smoke, quiet=True), write=False
        )
        result = results[0]
        failed = [m for m in result.models if m.model in refusals(result)]
        if failed:
            raise Refused(f"{failed[0].model}: {failed[0].message}; no overlay was built", result, hand)
        return result

    return build(tree, judged, out, names, runner, require_proof)
