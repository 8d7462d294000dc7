"""Proof before write on a vLLM tree: the release's own setter and forward, patched, on the CPU harness.

The pipeline's proof step (:mod:`patchcraft.pipeline.proof`) hands a vLLM
tree here instead of :func:`patchcraft.harness.runner.smoke_tree`; the rows
are the same :class:`~patchcraft.harness.runner.SmokeResult` records, so
withholding and the rows' words are the pipeline's. Each model row is run
twice through :mod:`patchcraft.harness.vllm_served`: on the text ``apply``
would write, and on that text with patchcraft's edits reverted (the
release as it was). Two scenarios:

- ``vllm-id-0``: ``(0, 2, n-1)`` and ``(0,)`` feed a copy of ``hs[0]`` (not
  the embedding tensor itself, which layer 0 adds into in place), then
  ``hs[2]``, ``hs[n-1]``;
- ``vllm-same``: ids without 0 (``(2, 5)``, ``(1, 4, n-1)`` and ``(3, n)``)
  feed exactly what the release fed (a crash included).

A model whose one edit copies the entry a capture before the layer loop
appends (``vllm-before-loop``, Kimi-Linear) changes only its id 0 too, so
its ``vllm-id-0`` is the same: ``(0, *rest)`` feeds a copy of ``hs[0]``,
then exactly what the release fed for ``rest``.

A model whose one edit is ``EagleModelMixin``'s capture (``vllm-mixin``,
0.18 on) shares that one method with every mixin model, and the edit
changes only its id 0: there ``vllm-id-0`` asks that ``(0, *rest)`` feed a
copy of ``hs[0]`` then exactly what the release fed for ``rest`` (the
release's own reading of the other ids is explain's report, not this
edit's). A mixin model the harness cannot run, or whose release already
crashes on ``rest``, proves nothing either way: its row is ``skipped``,
naming why and the mixin models the edit was proven on; with none proven,
it is the ``error`` that withholds the edit. A mixin model whose run shows
the edit wrong fails, and withholds it for all.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.sources import read_source
from patchcraft.base.status import HarnessStatus
from patchcraft.base.target import SglangTree
from patchcraft.engine.file_patch import revert_text
from patchcraft.engine.records import ModelResult
from patchcraft.harness import run_cache
from patchcraft.harness.rows import SmokeResult, SmokeRun, row_data, row_of
from patchcraft.harness.vllm_proof_rows import PROOF, UNSHOWN, asked, proof_rows
from patchcraft.harness.scenarios import Check
from patchcraft.harness.served import Fed, RunOutcome
from patchcraft.harness.standins import HarnessError
from patchcraft.harness.vllm_served import VllmModel, find_model, run_ids

#: Stand-in layers: enough for ids below, at and past the last layer.
LAYERS = 8
WITH_0 = ((0, 2, LAYERS - 1), (0,))
WITHOUT_0 = ((2, 5), (1, 4, LAYERS - 1), (3, LAYERS))


def prove_tree(tree: SglangTree, models: Sequence[ModelResult], texts: Optional[Mapping[Path, str]] = None) -> SmokeRun:
    """One row per model: run when patched (or already patched), skipped otherwise, saying why; each model's row
    kept by the bytes it ran (:mod:`patchcraft.harness.run_cache`), so another copy of the same tree, or the same
    apply again, answers from it."""
    known = run_cache.content_of(tree.package, texts, run_cache.VLLM_INPUTS)

    def one(label: str, path: str, mixin: bool, id0_only: bool) -> SmokeResult:
        row = run_cache.remembered(
            PROOF,
            tree.package,
            texts,
            asked(label, path, mixin, id0_only),
            lambda: prove_model(tree.package, label, path, texts or {}, mixin=mixin, id0_only=id0_only),
            row_data,
            row_of,
            inputs=run_cache.VLLM_INPUTS,
            tree_content=known,
        )
        assert row is not None
        return row

    run = proof_rows(tree, models, one)
    assert run is not None
    return run


def prove_model(
    package: Path, label: str, path: str, texts: Mapping[Path, str], mixin: bool = False, id0_only: bool = False
) -> SmokeResult:
    """The two scenarios for one model class (``module.Class``); ``mixin``: its one edit is the mixin's capture;
    ``id0_only``: its edits change id 0's entry alone (the mixin's, ``vllm-before-loop``)."""
    started = time.perf_counter()
    try:
        patched = find_model(package, label, texts)
        original = find_model(package, label, _reverted(patched, texts))
    except (HarnessError, PatchcraftError) as exc:
        return SmokeResult(label, path, HarnessStatus.ERROR, f"{UNSHOWN if mixin else 'cannot run'}: {exc}")
    unshown = UNSHOWN if mixin else "cannot run"  # not mixin: a row another row proves is skipped (_shared_rows)
    first = _id0_only(patched, original, unshown) if mixin or id0_only else _with_0(patched)
    checks = [first, _same(patched, original)]
    failed = next((c for c in checks if c.status != HarnessStatus.PASS), None)
    status = failed.status if failed is not None else HarnessStatus.PASS
    message = failed.detail if failed is not None else "id 0 feeds a copy of hs[0]; ids without 0 unchanged"
    return SmokeResult(label, path, status, message, tuple(checks), time.perf_counter() - started)


def _reverted(model: VllmModel, texts: Mapping[Path, str]) -> dict[Path, str]:
    """The model's files without patchcraft's edits: the release as it was."""
    reverted = {}
    for name in model.files:
        path = Path(name)
        text = texts.get(path)
        if text is None:
            text = read_source(path).text
        reverted[path] = revert_text(text, path)
    return reverted


def _outcome(model: VllmModel, ids: tuple[int, ...]) -> tuple[RunOutcome, tuple]:
    run = run_ids(model, ids, LAYERS)
    return run.outcome, run.aliased_holds


def _with_0(model: VllmModel) -> Check:
    for ids in WITH_0:
        outcome, aliased = _outcome(model, ids)
        if outcome.not_run:
            return Check("vllm-id-0", HarnessStatus.ERROR, f"{ids}: {outcome.not_run}")
        if outcome.crash:
            return Check("vllm-id-0", HarnessStatus.FAIL, f"{ids}: crash: {outcome.crash}")
        expected = tuple(Fed(i, True) for i in ids)
        if outcome.fed != expected or aliased:
            got = ", ".join(_said(f) for f in outcome.fed)
            return Check("vllm-id-0", HarnessStatus.FAIL, f"{ids}: fed {got}; expected a copy of hs[0], then hs[i]")
    return Check("vllm-id-0", HarnessStatus.PASS)


def _id0_only(patched: VllmModel, original: VllmModel, unshown: str = UNSHOWN) -> Check:
    """``(0, *rest)`` feeds a copy of hs[0], then what the release fed for ``rest``."""
    for ids in WITH_0:
        rest = tuple(i for i in ids if i != 0)
        before = _outcome(original, rest)[0] if rest else None
        if before is not None and (before.not_run or before.crash):
            why = before.not_run or f"crash: {before.crash}"
            return Check("vllm-id-0", HarnessStatus.ERROR, f"{unshown}: the release as it was, {rest}: {why}")
        outcome, aliased = _outcome(patched, ids)
        if outcome.not_run:
            return Check("vllm-id-0", HarnessStatus.ERROR, f"{unshown}: {ids}: {outcome.not_run}")
        if outcome.crash:
            return Check("vllm-id-0", HarnessStatus.FAIL, f"{ids}: crash: {outcome.crash}")
        others = before.fed if before is not None else ()
        if outcome.fed != (Fed(0, True), *others) or aliased:
            got = ", ".join(_said(f) for f in outcome.fed)
            want = "a copy of hs[0]" + "".join(f", {_said(f)}" for f in others)
            return Check("vllm-id-0", HarnessStatus.FAIL, f"{ids}: fed {got}; expected {want}")
    return Check("vllm-id-0", HarnessStatus.PASS)


def _same(patched: VllmModel, original: VllmModel) -> Check:
    for ids in WITHOUT_0:
        now, before = _outcome(patched, ids)[0], _outcome(original, ids)[0]
        if now.not_run or before.not_run:
            return Check("vllm-same", HarnessStatus.ERROR, f"{ids}: {now.not_run or before.not_run}")
        if (now.fed, bool(now.crash)) != (before.fed, bool(before.crash)):
            said = lambda o: f"crash: {o.crash}" if o.crash else ", ".join(_said(f) for f in o.fed)
            return Check("vllm-same", HarnessStatus.FAIL, f"{ids}: fed {said(now)}; the release fed {said(before)}")
    return Check("vllm-same", HarnessStatus.PASS)


def _said(fed: Fed) -> str:
    if fed.state is None:
        return fed.what or "an unknown tensor"
    return f"hs[{fed.state}]" + ("" if fed.copy else " (the embedding tensor itself, not a copy)")
