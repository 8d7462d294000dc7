"""vLLM's proof rows put together, without torch: :func:`proof_rows` turns apply's models into the proof's rows.

:mod:`patchcraft.harness.vllm_proof` runs each row (torch, the CPU
harness); the pipeline's proof step asks here first with the rows kept by
:mod:`patchcraft.harness.run_cache` for the same bytes, and imports torch
only when one is not kept. The rules that turn single rows into the tree's
verdict are here, so both ways give the same rows: a model not patched is
skipped, saying why; a mixin row that could not show the mixin's edit is
skipped when another mixin row proved it; a row the harness cannot run
whose every edit site is proven on rows that ran is skipped, naming them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from patchcraft.base.status import EditKind, HarnessStatus, ModelStatus
from patchcraft.harness.rows import SmokeResult, SmokeRun

if TYPE_CHECKING:
    from patchcraft.base.target import SglangTree
    from patchcraft.engine.records import ModelResult

#: The run cache's kind of a vLLM proof row (:mod:`patchcraft.harness.run_cache`).
PROOF = "vllm-proof"
#: The message of a mixin row that could not show the edit (``error``, until another mixin model proves it).
UNSHOWN = "cannot show the mixin's edit on this class"
#: One model's row: ``(label, path, mixin, id0_only)`` -> the row, or None when it is not at hand (not kept).
One = Callable[[str, str, bool, bool], Optional[SmokeResult]]


def asked(label: str, path: str, mixin: bool, id0_only: bool) -> tuple:
    """What one proof row asks, as the run cache keys it."""
    return (label, path, mixin, id0_only)


def proof_rows(tree: "SglangTree", models: Sequence["ModelResult"], one: One) -> Optional[SmokeRun]:
    """One row per model: ``one`` for a patched (or already patched) model, skipped otherwise, saying why; None
    when ``one`` has no row for a model."""
    rows = []
    mixin = set()
    only_id0 = (EditKind.VLLM_MIXIN, EditKind.VLLM_BEFORE_LOOP, EditKind.VLLM_ADD_CAPTURE)
    sites: dict[str, frozenset[tuple[str, str, str]]] = {}
    for model in models:
        if model.status not in (ModelStatus.PATCHED, ModelStatus.ALREADY):
            rows.append(SmokeResult(model.model, model.path, HarnessStatus.SKIPPED, f"{model.status}: {model.message}"))
            continue
        if model.edits and all(e.kind == EditKind.VLLM_MIXIN for e in model.edits):
            mixin.add(model.model)
        sites[model.model] = frozenset((e.file, e.cls, e.method) for e in model.edits)
        id0_only = bool(model.edits) and all(e.kind in only_id0 for e in model.edits)
        row = one(model.model, model.path, model.model in mixin, id0_only)
        if row is None:
            return None
        rows.append(row)
    return SmokeRun(tree=tree, version=tree.version, results=tuple(_shared_rows(_mixin_rows(rows, mixin), sites)))


def kept_proof_rows(
    tree: "SglangTree", models: Sequence["ModelResult"], texts: Optional[Mapping[Path, str]]
) -> Optional[SmokeRun]:
    """The proof's rows as kept for these bytes (:mod:`patchcraft.harness.run_cache`), or None when one is not
    kept (the harness must run). No torch."""
    from patchcraft.harness import run_cache
    from patchcraft.harness.rows import row_of

    known = run_cache.content_of(tree.package, texts, run_cache.VLLM_INPUTS)
    if known is None:
        return None

    def one(label: str, path: str, mixin: bool, id0_only: bool) -> Optional[SmokeResult]:
        return run_cache.recall(
            PROOF,
            tree.package,
            texts,
            asked(label, path, mixin, id0_only),
            row_of,
            inputs=run_cache.VLLM_INPUTS,
            tree_content=known,
        )

    return proof_rows(tree, models, one)


def _shared_rows(rows: list[SmokeResult], sites: Mapping[str, frozenset[tuple[str, str, str]]]) -> list[SmokeResult]:
    """A row the harness cannot run whose every edit site is proven on rows that ran (a wrapper whose language
    model shares another model's forward: 0.17's Llama4ForConditionalGeneration; a forward that is ``return
    super().forward(...)``, whose layer call the harness does not find: 0.15-0.17's Mistral) is skipped, naming
    them; with none, it stays the error that withholds the edit. A row's error is the harness not running it
    (a wrong result is a failure, never an error)."""
    passed = [r.model for r in rows if r.status == HarnessStatus.PASS]
    out = []
    for r in rows:
        own = sites.get(r.model, frozenset())
        if r.status == HarnessStatus.ERROR and own:
            covering = [m for m in passed if sites.get(m, frozenset()) & own]
            if covering and own <= frozenset().union(*(sites[m] for m in covering)):
                shown = ", ".join(covering[:3]) + (f" and {len(covering) - 3} more" if len(covering) > 3 else "")
                r = replace(r, status=HarnessStatus.SKIPPED, message=f"{r.message}; its edits are proven on {shown}")
        out.append(r)
    return out


def _mixin_rows(rows: list[SmokeResult], mixin: set[str]) -> list[SmokeResult]:
    """A mixin row that could not show the edit is skipped, naming the mixin rows that proved it (if any did)."""
    proven = [r.model for r in rows if r.model in mixin and r.status == HarnessStatus.PASS]
    if not proven:
        return rows
    shown = ", ".join(proven[:3]) + (f" and {len(proven) - 3} more" if len(proven) > 3 else "")
    return [
        replace(
            r,
            status=HarnessStatus.SKIPPED,
            message=f"{r.message}; the edit is EagleModelMixin's alone, proven on {shown}",
        )
        if r.model in mixin and r.status == HarnessStatus.ERROR
        else r
        for r in rows
    ]
