"""Smoke-run every patched model class of a tree: one :class:`SmokeResult` row each.

For each model class the harness builds stand-in instances from the
patched files and from their revert (the original) and runs the scenarios
of :mod:`patchcraft.harness.scenarios`; see docs/harness.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch

from patchcraft.reading.class_graph import ModelGraph
from patchcraft.planning.records import ModelPlan
from patchcraft.harness import run_cache
from patchcraft.harness.assemble import Program, Sources
from patchcraft.harness.extract import ORIGINAL, PATCHED
from patchcraft.harness.rows import SCENARIOS, Check, SmokeResult, SmokeRun, row_data, row_of
from patchcraft.harness.scenarios import ERROR, FAIL, NOT_APPLICABLE, PASS, SKIPPED, Scenarios
from patchcraft.harness.shapes import ShapeError
from patchcraft.harness.standins import HarnessError
from patchcraft.harness.subject import Subject, subjects
from patchcraft.planning.model_plans import plan_models, scan
from patchcraft.engine.records import ModelResult
from patchcraft.planning.selection import select
from patchcraft.base.memo import Memo, stamp
from patchcraft.base.status import HarnessStatus, ModelStatus
from patchcraft.base.target import SglangTree

__all__ = [
    "ERROR",
    "FAIL",
    "NOT_APPLICABLE",
    "PASS",
    "SKIPPED",
    "Check",
    "SmokeResult",
    "SmokeRun",
    "smoke_model",
    "smoke_tree",
]


def shape_of(subject: Subject) -> str:
    text = subject.forward.text
    collector = "packer" if "AuxHiddenStatePacker" in text else "aux-list" if "AuxHiddenStateList" in text else "list"
    into = ", collector into layers" if subject.call.captures else ""
    return f"{collector}, residual {subject.call.residual_kind}{into}"


def smoke_model(graph: ModelGraph, plan: ModelPlan, programs: dict[str, Program], path: str) -> SmokeResult:
    """All scenarios for one model class (every inner model class it may build)."""
    return subject_row(graph, plan, programs, path, lambda subject: Scenarios(subject).all(), "all scenarios pass")


def subject_row(
    graph: ModelGraph,
    plan: ModelPlan,
    programs: dict[str, Program],
    path: str,
    checks_of: Callable[[Subject], Iterable[Check]],
    passed: str,
) -> SmokeResult:
    """One row: the checks of every subject of ``plan`` (prefixed with its inner class when there are several).

    The row fails on the first failed check, else errs on the first error;
    ``passed`` is its message when every check passes.
    """
    start = time.perf_counter()
    try:
        found = subjects(graph, plan, programs)
    except (HarnessError, ShapeError) as exc:
        return SmokeResult(plan.label, path, ERROR, str(exc), seconds=time.perf_counter() - start)
    checks: list[Check] = []
    for subject in found:
        prefix = f"{subject.inner.name}: " if len(found) > 1 else ""
        checks.extend(
            Check(check.name, check.status, prefix + check.detail, check.note) for check in checks_of(subject)
        )
    status = (
        FAIL if any(c.status == FAIL for c in checks) else ERROR if any(c.status == ERROR for c in checks) else PASS
    )
    first = next((c for c in checks if c.status == status), None) if status != PASS else None
    notes = "; ".join(f"{c.name}: {c.note}" for c in checks if c.note)
    message = f"{first.name}: {first.detail}" if first else passed
    shape = "; ".join(sorted({shape_of(s) for s in found}))
    return SmokeResult(plan.label, path, status, message, tuple(checks), time.perf_counter() - start, shape, notes)


#: The model graph and plans of a models folder, kept while none of its files changes.
_PLANNED: Memo[tuple[ModelGraph, list[ModelPlan]]] = Memo(keep=8)


def _planned(models_dir: Path) -> tuple[ModelGraph, list[ModelPlan]]:
    """The model graph and plans of ``models_dir``, kept while no file there changes (:mod:`patchcraft.base.memo`)."""

    def compute() -> tuple[ModelGraph, list[ModelPlan]]:
        graph = scan(models_dir)
        return graph, plan_models(graph)

    return _PLANNED.get(str(models_dir.resolve()), lambda: stamp(folders=[(models_dir, False)]), compute)


def smoke_tree(
    tree: SglangTree,
    names: Sequence[str] = (),
    models: Optional[Sequence[ModelResult]] = None,
    texts: Optional[Mapping[Path, str]] = None,
    check: Callable[[ModelGraph, ModelPlan, dict[str, Program], str], SmokeResult] = smoke_model,
    on_row: Optional[Callable[[str, int, int], None]] = None,
) -> SmokeRun:
    """Smoke-run the patched model classes of ``tree``; one row each.

    ``models``: the engine's verdicts (from verify, or apply): only those
    patched are run, the others get a ``skipped`` row saying why. Without
    them every supported model class selected by ``names`` is run, patched
    or not (a mutation test wants that). ``texts``: file texts to use
    instead of the files on disk, e.g. what apply would write. ``check``:
    what one row runs (:func:`smoke_model`, the five scenarios; or
    :func:`patchcraft.harness.compiled.compile_model`). ``on_row``: called
    ``(model, rows run, rows to run)`` as each row to run starts (a
    progress line; the harness never prints).
    """
    graph, planned = _planned(tree.models_dir)
    plans = {p.label: p for p in select(planned, tree, names)}
    if models is not None and any(m.model not in plans for m in models):
        # an entry class that inherits another's setter and sites has a row when named (ModelPlan.inherits): run it too
        plans.update((p.label, p) for p in plan_models(graph, inheriting=True) if p.inherits and p.label not in plans)
    sources = Sources(tree.package, texts)
    programs = {variant: Program(graph, sources, variant) for variant in (PATCHED, ORIGINAL)}
    if models is None:
        verdicts = [
            (label, tree.relative(p.path), "" if p.unsupported is None else f"unsupported: {p.unsupported}")
            for label, p in plans.items()
        ]
    else:
        verdicts = [
            (
                m.model,
                m.path,
                ""
                if m.status in (ModelStatus.ALREADY, ModelStatus.PATCHED)
                else f"{m.status}: {m.message or m.status}",
            )
            for m in models
            if m.model in plans
        ]
    rows = []
    to_run, ran = sum(not reason for _, _, reason in verdicts), 0
    for label, path, reason in verdicts:
        if reason:
            rows.append(SmokeResult(label, path, SKIPPED, reason))
            continue
        if on_row is not None:
            on_row(label, ran, to_run)
        ran += 1
        rows.append(_row(tree, texts, check, graph, plans[label], programs, path))
    return SmokeRun(tree=tree, version=tree.version, results=tuple(rows))


def _row(
    tree: SglangTree,
    texts: Optional[Mapping[Path, str]],
    check: Callable[[ModelGraph, ModelPlan, dict[str, Program], str], SmokeResult],
    graph: ModelGraph,
    plan: ModelPlan,
    programs: dict[str, Program],
    path: str,
) -> SmokeResult:
    """One row; the scenarios' row of the same class on the same bytes from the cache (:mod:`patchcraft.harness.run_cache`)."""

    def run() -> SmokeResult:
        with torch.no_grad():
            return check(graph, plan, programs, path)

    if check is not smoke_model:  # another check (compile, a test's) is run every time
        return run()
    row = run_cache.remembered(SCENARIOS, tree.package, texts, (plan.label, path), run, row_data, row_of)
    assert row is not None
    return row
