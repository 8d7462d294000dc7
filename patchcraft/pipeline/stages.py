"""The pipeline's stages for apply, check, diff, verify and revert: one tree or many, judged, proven, written.

:func:`run` takes the options a command parsed and returns a
:class:`PipelineRun`: the records, the hand-edit reports and the exit
code, decided by :func:`patchcraft.ui.machine_output.exit_code` from the
records. The command renders it (:mod:`patchcraft.commands._pipeline`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from patchcraft.engine import result_cache
from patchcraft.base import tree_lock
from patchcraft.ui import console
from patchcraft.ui import machine_output
from patchcraft.pipeline import hand_review, proof as _proof
from patchcraft.engine import hand_advice
from patchcraft.engine.tree_run import claim_written, run, withhold_unnamed, write_changes
from patchcraft.engine.hand_edits import FileReport
from patchcraft.engine.records import Mode, RunResult
from patchcraft.base.sources import remove_stale_temp_files
from patchcraft.base.engines import ServingEngine, detect_engine
from patchcraft.base.target import SglangTree, resolve_target
from patchcraft.overlay.check import require_usable_tree


@dataclass(frozen=True)
class Options:
    """Options shared by every pipeline command (one object, set once at the CLI edge)."""

    targets: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    output_format: str = "text"
    color: str = "auto"
    show_diff: bool = False
    #: ``apply`` exits 1 when it rewrote a file (formatter-style, for pre-commit).
    fail_on_change: bool = False
    #: Also make CUDA-graph capture use the configured ids (``--no-runner`` turns it off).
    runner: bool = True
    #: Also keep captured states reduced under all-reduce fusion (``--no-fusion-fix`` turns it off).
    fusion: bool = True
    #: Files patched at once, in worker processes (``--jobs``; None: one per core).
    jobs: int | None = None
    #: Run the CPU harness before apply writes, and on hand-made edits in verify (``--no-smoke``: off).
    smoke: bool = True
    #: Unsupported models fail the run even when not named with ``--model``.
    strict: bool = False
    #: ``apply --replace-hand-edits``: patch the pristine text of files edited by hand at patchcraft's edit sites only.
    replace_hand_edits: bool = False
    #: ``--engine``: whose trees TARGET names (None: told from TARGET or the installs, base.engines.detect_engine).
    engine: ServingEngine | None = None


@dataclass(frozen=True)
class HandEdits:
    """What a run found against the pristine text: one report per model file, per tree, and what it restored."""

    reports: tuple[dict[str, FileReport], ...] = ()
    replaced: tuple[FileReport, ...] = ()


def default_jobs() -> int:
    """The cores this process may run on (a container's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_targets(targets: Sequence[str], engine: ServingEngine | None = None) -> list[SglangTree]:
    """One tree per package (SGLang's, or vLLM's: ``engine``, or told from each TARGET), in the order first named.

    pre-commit passes many model files at once: those of one package become
    one run (one class graph, each model once, one exit code), not one per file.
    A whole-tree TARGET for a package makes the merged run cover the whole tree.
    """
    if not targets:
        return [_resolve(None, engine)]
    merged: dict[Path, SglangTree] = {}
    for target in targets:
        tree = _resolve(target, engine)
        require_usable_tree(tree.package)  # an overlay's tree is judged only when the overlay is intact
        key = tree.package.resolve()
        prior = merged.get(key)
        if prior is None:
            merged[key] = tree
        elif not tree.only_files:
            merged[key] = replace(tree, only_files=())
        elif prior.only_files:
            extra = tuple(f for f in tree.only_files if f not in prior.only_files)
            merged[key] = replace(prior, only_files=prior.only_files + extra)
    return list(merged.values())


def _resolve(target: str | None, engine: ServingEngine | None) -> SglangTree:
    if detect_engine(target, engine) is ServingEngine.VLLM:
        from patchcraft.base.vllm_tree import resolve_vllm_target

        return resolve_vllm_target(target)
    return resolve_target(target)


def judge_and_write(
    trees: Sequence[SglangTree],
    mode: Mode,
    models: Sequence[str],
    runner: bool = True,
    jobs: int = 1,
    proof: Callable[[RunResult], RunResult] | None = None,
    fusion: bool = True,
    replace_hand_edits: bool = False,
    write: bool = True,
) -> tuple[list[RunResult], HandEdits]:
    """Read, transform, prove and (for apply/revert) write, holding each tree's lock throughout.

    The lock covers the reads too: a second run waits, then reads what the
    first one wrote. Every check that can refuse runs before the first
    write (``proof``, the harness, among them: what it fails is withheld),
    and all files of all trees are written together or not at all.
    ``write=False``: judged as for a write, written nowhere (an overlay takes the result).
    """
    writes = write and mode in (Mode.APPLY, Mode.REVERT)
    with tree_lock.hold([t.models_dir for t in trees] if writes else [], on_wait=console.print_line):
        if writes:
            remove_stale_temp_files(d for t in trees for d in (t.models_dir, t.executor_dir))
        results = [_run(tree, mode, models, runner, jobs, fusion) for tree in trees]
        reports = [hand_review.file_reports(r) if mode in hand_review.JUDGED else {} for r in results]
        bases: list[dict[Path, str]] = [{} for _ in results]
        if replace_hand_edits and mode in (Mode.APPLY, Mode.CHECK):
            bases = [hand_review.replacements(r, rep) for r, rep in zip(results, reports)]
            # The restored files are patched afresh from their pristine text (never from the result_cache).
            results = [
                run(r.tree, mode, models, runner=runner, jobs=jobs, fusion=fusion, base_texts=base) if base else r
                for r, base in zip(results, bases)
            ]
        if proof is not None:
            results = [proof(result) for result in results]
        results = [claim_written(withhold_unnamed(result, models)) for result in results]
        scope = hand_advice.Scope.of(models, runner, fusion)
        results = [hand_review.advise(r, rep, scope) for r, rep in zip(results, reports)]
        if writes:
            for result in results:
                for change in result.changes:
                    result.tree.check_inside(change.source.path)
            write_changes([change for result in results for change in result.changes])
    return results, HandEdits(tuple(reports), tuple(hand_review.replaced_files(reports, bases)))


def _run(
    tree: SglangTree, mode: Mode, models: Sequence[str], runner: bool, jobs: int, fusion: bool = True
) -> RunResult:
    """One tree's run; a read-only one comes from the result cache when nothing it reads changed."""
    return result_cache.cached_run(
        tree,
        mode,
        models,
        runner,
        lambda: run(tree, mode, models, runner=runner, jobs=jobs, fusion=fusion),
        fusion=fusion,
    )


@dataclass(frozen=True)
class PipelineRun:
    """What one pipeline command did: a result per tree, the hand-edit reports, and the exit code."""

    mode: Mode
    results: tuple[RunResult, ...]
    hand: HandEdits
    code: int


def run_trees(options: Options, mode: Mode) -> PipelineRun:
    """Run ``mode`` on every target of ``options``, prove, withhold and (apply, revert) write; nothing printed
    but the lock-wait and no-torch lines."""
    trees = resolve_targets(options.targets, options.engine)
    jobs = options.jobs if options.jobs is not None else default_jobs()
    proof = _proof.gate(mode.value, options.smoke, quiet=options.output_format == "json")
    results, hand = judge_and_write(
        trees,
        mode,
        options.models,
        options.runner,
        jobs,
        proof,
        fusion=options.fusion,
        replace_hand_edits=options.replace_hand_edits,
    )
    code = machine_output.exit_code(results, options.models, options.strict, fail_on_change=options.fail_on_change)
    return PipelineRun(mode, tuple(results), hand, code)
