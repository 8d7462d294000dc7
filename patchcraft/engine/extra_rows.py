"""The tree rows of a run: ``runner`` (graph capture gets the configured ids) and
``allreduce-fusion`` (captured states stay reduced at TP > 1).

Each is one row per tree, not per model class: its sites are planned from
``srt/model_executor/`` (:mod:`patchcraft.planning.runner_edits`) or from
``srt/layers/communicator.py`` (the fusion transform's ``plan``), and its
edits go together, like a model's: if one site fails, none is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

from patchcraft import MARKER
from patchcraft.planning import runner_edits
from patchcraft.reading.class_graph import SETTER
from patchcraft.base.errors import PatchcraftError
from patchcraft.engine.file_patch import compiles, patch_text, revert_text
from patchcraft.engine.records import EditResult, FileChange, Mode, ModelResult
from patchcraft.base.sources import Source, read_source
from patchcraft.base.status import EDIT_IN_PLACE, EditStatus, ModelStatus
from patchcraft.base.target import SglangTree

if TYPE_CHECKING:
    from patchcraft.transforms import configure_ids_before_graphs as runner_transform
    from patchcraft.transforms import keep_captured_states_reduced as fusion_transform
else:
    from patchcraft.base.lazy import Deferred

    runner_transform = Deferred("patchcraft.transforms.configure_ids_before_graphs")
    fusion_transform = Deferred("patchcraft.transforms.keep_captured_states_reduced")

TreeRow = tuple[Optional[ModelResult], tuple[FileChange, ...]]
_REVERTED = "patchcraft edits removed"
_CLEAN = "no patchcraft edits found"


def edit_result(tree: SglangTree, site, name: str, outcome, missing_detail: str = "") -> EditResult:
    """One edit site's row: what its transform found there (``outcome``), or an error when it found nothing.

    The one place a transform's outcome becomes an :class:`EditResult`, for
    the model rows (:func:`patchcraft.engine.tree_run.run`) and the tree rows here.
    """
    status = EditStatus(outcome.status) if outcome else EditStatus.ERROR
    detail = outcome.detail if outcome else missing_detail
    return EditResult(site.kind, name, tree.relative(site.path), site.cls, site.method, status, detail)


@dataclass(frozen=True)
class _Row:
    """What a tree row says whatever its status: its name, file, edits and notes."""

    model: str
    path: str
    edits: tuple[EditResult, ...] = ()
    files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def result(
        self, status: ModelStatus, message: str, compiles: bool | None = None, idempotent: bool | None = None
    ) -> ModelResult:
        return ModelResult(
            model=self.model, path=self.path, status=status, edits=self.edits, message=message,
            files=self.files, compiles=compiles, idempotent=idempotent, notes=self.notes,
        )  # fmt: skip

    def judged(
        self, mode: Mode, changes: tuple[FileChange, ...], compiled: bool | None, done: str, added: str, missing: str
    ) -> TreeRow:
        """Already patched (every edit in place), patched (apply), or would patch."""
        if all(e.status in EDIT_IN_PLACE for e in self.edits):
            hand = (
                " (hand-applied edits recognised)"
                if any(e.status == EditStatus.HAND_APPLIED for e in self.edits)
                else ""
            )
            return self.result(ModelStatus.ALREADY, f"{done}{hand}", compiled, idempotent=True), ()
        if mode is Mode.APPLY:
            return self.result(ModelStatus.PATCHED, f"added: {added}"), changes
        return self.result(
            ModelStatus.WOULD, f"missing: {missing}", compiled, idempotent=False if mode is Mode.VERIFY else None
        ), changes


def runner_row(tree: SglangTree, mode: Mode) -> TreeRow:
    """The ``runner`` row and its changes (none for a tree without ``model_executor/``)."""
    directory = tree.executor_dir
    if not directory.is_dir():
        return None, ()
    row = _Row(model=runner_edits.ROW, path=tree.relative(directory))
    if mode is Mode.REVERT:
        return _revert(tree, row, [p for p in sorted(directory.rglob("*.py")) if _marked(p)])
    try:
        plan = runner_edits.plan_runner(directory)
    except PatchcraftError as exc:
        return row.result(ModelStatus.ERROR, str(exc)), ()
    if plan.not_needed:
        return row.result(ModelStatus.NOT_NEEDED, plan.not_needed), ()
    if plan.unsupported or plan.runner is None:
        return row.result(ModelStatus.UNSUPPORTED, plan.unsupported or "no model runner found"), ()
    sources: dict[Path, Source] = {}
    afters: dict[Path, str] = {}
    edits: list[EditResult] = []
    errors: list[str] = []
    for path in plan.files:
        try:
            sources[path] = read_source(path)
            sites = [s for s in plan.sites if s.path == path]
            patch = patch_text(sources[path].text, path, sites, {runner_edits.KIND: runner_transform})
        except PatchcraftError as exc:
            errors.append(str(exc))
            continue
        found = [s for s in sites if s.key in patch.outcomes]
        edits.extend(edit_result(tree, s, runner_transform.NAME, patch.outcomes[s.key]) for s in found)
        errors.extend(patch.errors.values())
        afters[path] = patch.after
    notes = tuple(f"{e.file}: {e.cls}.{e.method}" for e in edits)
    row = replace(
        row,
        path=tree.relative(plan.runner),
        edits=tuple(edits),
        files=tuple(tree.relative(f) for f in plan.files),
        notes=notes,
    )
    compiled = all(compiles(src) for src in sources.values()) if mode is Mode.VERIFY else None
    if errors:
        return row.result(ModelStatus.ERROR, errors[0]), ()
    changes = tuple(
        FileChange(source=sources[p], rel=tree.relative(p), after=afters[p])
        for p in plan.files
        if afters[p] != sources[p].text
    )
    to_make = sum(e.status == EditStatus.APPLIED for e in edits)
    missing = f"graph capture resets the ids to the defaults ({to_make} of {len(edits)} edits to make)"
    return row.judged(
        mode, changes, compiled, "configured ids reach graph capture", "configured ids reach graph capture", missing
    )


def fusion_row(tree: SglangTree, mode: Mode) -> TreeRow:
    """The ``allreduce-fusion`` row and its change (none for a tree without ``srt/layers/``'s decision).

    ``not-needed`` where no EAGLE-3 model's capture reads ``hidden_states +
    residual`` before a deferred all-reduce (found through the class graph:
    :mod:`patchcraft.reading.fusion_reading`), on releases that reduce at layer
    boundaries (``srt/layers/layer_boundary``, 0.5.21 on) too. A partial copy
    of a release (no ``communicator.py``, no ``layer_boundary``) gets no row.
    """
    path = fusion_transform.communicator_path(tree.package)
    row = _Row(model=fusion_transform.ROW, path=tree.relative(path))
    if not path.is_file():
        boundary = tree.package / "srt" / "layers" / "layer_boundary"
        if boundary.is_dir():
            return _boundary_row(tree, replace(row, path=tree.relative(boundary))), ()
        return None, ()
    if mode is Mode.REVERT:
        return _revert(tree, row, [path])
    try:
        plan = fusion_transform.plan(tree.package, tree.models_dir)
    except PatchcraftError as exc:
        return row.result(ModelStatus.ERROR, str(exc)), ()
    notes = tuple(
        f"{PARTIAL_SUMS}{c.model} ({tree.relative(c.forward_path)}; {LAYER_MARK}{c.setter_cls}.{SETTER} in {tree.relative(c.setter_path)})"
        for c in plan.affected
    )
    row = replace(row, notes=notes + tuple(f"decision override: {o}" for o in plan.overrides))
    if plan.not_needed:
        return row.result(ModelStatus.NOT_NEEDED, plan.not_needed), ()
    if plan.unsupported or plan.site is None:
        return row.result(ModelStatus.UNSUPPORTED, plan.unsupported or "no decision found"), ()
    site = plan.site
    try:
        source = read_source(path)
        patch = patch_text(source.text, path, [site], {fusion_transform.KIND: fusion_transform})
    except PatchcraftError as exc:
        return row.result(ModelStatus.ERROR, str(exc)), ()
    outcome = patch.outcomes.get(site.key)
    edits = (edit_result(tree, site, fusion_transform.NAME, outcome),)
    row = replace(row, edits=edits, files=(row.path,))
    compiled = compiles(source) if mode is Mode.VERIFY else None
    if patch.errors:
        return row.result(ModelStatus.ERROR, next(iter(patch.errors.values()))), ()
    assert outcome is not None
    changes = (FileChange(source=source, rel=row.path, after=patch.after),)
    return row.judged(
        mode, changes, compiled, "EAGLE-3 captures reduced states at TP > 1",
        f"{KEEP_REDUCED} ({_models(plan.affected)})",
        f"at TP > 1 with all-reduce fusion, {_models(plan.affected)} capture per-rank partial sums",
    )  # fmt: skip


def _models(affected: Sequence) -> str:
    return _names(c.model for c in affected)


def _names(labels: Iterable[str]) -> str:
    names = sorted({label.rpartition(".")[2] for label in labels})
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


#: A fusion row's note per model whose capture reads a partial sum, and its "added" claim.
PARTIAL_SUMS = "captures partial sums: "
KEEP_REDUCED = "the layers whose output a capture reads keep it reduced"


#: What a fusion note says of the setter that marks the model's layers (its class and file).
LAYER_MARK = "layer mark: "
_MARKED_BY = re.compile(rf"; {LAYER_MARK}(\w+)\.\w+ in ([^)]+)\)$")


def fusion_claim(
    row: ModelResult, written: Callable[[str], bool], marked: Callable[[str, str], bool] = lambda f, c: False
) -> ModelResult:
    """A patched ``allreduce-fusion`` row names only the models whose layer marks this run writes.

    The guard in ``communicator.py`` keeps a layer reduced only where the
    model's own file marks it (the ``fusion-mark`` edit, in the model's row):
    a model withheld, or not in the run (``--model``), gets no mark, so the
    row does not claim it. A model is marked when its row is written
    (``written(label)``), or when the setter that marks its layers is
    (``marked(file, class)``): a subclass that inherits its parent's setter
    and has no row of its own (``DeepseekV3ForCausalLM`` in a whole-tree
    run, folded into ``DeepseekV2ForCausalLM``'s row) is marked by it.
    """
    affected: list[tuple[str, bool]] = []
    for note in row.notes:
        if note.startswith(PARTIAL_SUMS):
            label = note[len(PARTIAL_SUMS) :].split(" (", 1)[0]
            by = _MARKED_BY.search(note)
            affected.append((label, written(label) or (by is not None and marked(by.group(2), by.group(1)))))
    if row.status != ModelStatus.PATCHED or not affected:  # only the fusion row has these notes
        return row
    kept = [label for label, done in affected if done]
    if len(kept) == len(affected):
        return row
    left = _names(label for label, done in affected if not done)
    if kept:
        message = (
            f"added: {KEEP_REDUCED} ({_names(kept)}); not for {left}: their layer marks are not written in this run"
        )
    else:
        message = (
            f"added: the guard in {Path(row.path).name} only; no layer is marked yet: the layer marks of {left} "
            "are not written in this run"
        )
    return replace(row, message=message)


def _boundary_row(tree: SglangTree, row: _Row) -> Optional[ModelResult]:
    """A release without the decision: not-needed when no EAGLE-3 capture reads a deferred sum."""
    try:
        affected = fusion_transform.affected_models(tree.package, tree.models_dir)
    except PatchcraftError as exc:
        return row.result(ModelStatus.ERROR, str(exc))
    if affected:
        notes = tuple(f"captures partial sums: {c.model} ({tree.relative(c.forward_path)})" for c in affected)
        message = f"{_models(affected)} capture a deferred all-reduce sum, and {tree.noun} has no {fusion_transform.COMMUNICATOR} decision to guard"
        return replace(row, notes=notes).result(ModelStatus.UNSUPPORTED, message)
    return row.result(ModelStatus.NOT_NEEDED, f"{fusion_transform.NOT_NEEDED}; no decoder layer defers its all-reduce")


def _marked(path: Path) -> bool:
    try:
        return MARKER.encode() in path.read_bytes()
    except OSError:
        return False


def _revert(tree: SglangTree, row: _Row, paths: Sequence[Path]) -> TreeRow:
    """The row of a revert of those of ``paths`` that hold the marker."""
    changes = []
    for path in paths:
        source = read_source(path)
        if MARKER not in source.text:
            continue
        after = revert_text(source.text, path)
        if after != source.text:
            changes.append(FileChange(source=source, rel=tree.relative(path), after=after))
    if changes:
        return replace(row, files=tuple(c.rel for c in changes)).result(ModelStatus.REVERTED, _REVERTED), tuple(changes)
    return row.result(ModelStatus.NOT_PATCHED, _CLEAN), ()
