"""A whole tree: plan, transform and judge every model; it returns records and never prints.

:func:`run` builds a :class:`~patchcraft.engine.records.RunResult` for a tree in
one of the modes: the plans come from the planning layer
(:mod:`patchcraft.planning.selection`), each file's text is patched by
:mod:`patchcraft.engine.file_patch` (in worker processes with ``jobs`` > 1), the
tree rows by :mod:`patchcraft.engine.extra_rows`. Writing files is left to
:func:`write_changes`, so ``--check``, ``diff`` and ``verify`` share every
step with ``apply`` except the last.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Hashable, Mapping, Sequence, TypeVar

from patchcraft.planning import runner_edits
from patchcraft.base.errors import PatchcraftError
from patchcraft.planning.records import EditSite, ModelPlan
from patchcraft.engine.file_patch import FilePatch, compiles, patch_text, revert_text
from patchcraft.engine.records import EditResult, FileChange, Mode, ModelResult, ProofVerdict, RunResult
from patchcraft.planning.selection import is_named, plan_tree
from patchcraft.base.sources import Source, check_writable, read_source, write_all
from patchcraft.base.status import EDIT_IN_PLACE, EditStatus, ModelStatus, Proof, WITHHELD, EditKind
from patchcraft.base.target import SglangTree
from patchcraft.engine.extra_rows import edit_result, fusion_claim, fusion_row, runner_row
from patchcraft.engine.workers import gc_paused, map_files

#: A file, as the engine (a path) or a result row (its relative name) holds it.
K = TypeVar("K", bound=Hashable)

if TYPE_CHECKING:
    from patchcraft.transforms import BY_KIND
    from patchcraft.transforms import keep_captured_states_reduced as fusion_transform
else:
    # The transforms load on first use: a run answered from the result cache needs none (docs/performance.md).
    from patchcraft.base.lazy import Deferred

    BY_KIND = Deferred("patchcraft.transforms", "BY_KIND")
    fusion_transform = Deferred("patchcraft.transforms.keep_captured_states_reduced")

# -- whole tree ----------------------------------------------------------------


@gc_paused
def run(
    tree: SglangTree,
    mode: Mode,
    names: Sequence[str] = (),
    runner: bool = True,
    jobs: int = 1,
    fusion: bool = True,
    base_texts: Mapping[Path, str] | None = None,
    reaching: Sequence[Path] = (),
) -> RunResult:
    """Plan, transform and judge every selected model; no file is written here.

    With ``runner`` (the default), a run over a tree also checks that CUDA
    graphs are captured with the configured ids (one extra row, ``runner``),
    with or without ``--model`` names: a model patched for -1 still decodes
    with the default layers when the runner resets them. ``--model runner``
    selects that row alone; single-file targets leave it out.

    With ``fusion`` (the default), one more row, ``allreduce-fusion``:
    EAGLE-3 turns off the deferred all-reduce of ``srt/layers/communicator.py``
    where a model would capture per-rank partial sums at TP > 1
    (``--no-fusion-fix`` leaves it out; ``--model allreduce-fusion`` selects it alone).

    ``jobs`` > 1 patches that many files at once in worker processes; the
    result is the same as with ``jobs=1``, in the same order.

    ``base_texts`` (model file -> text) patches that text instead of the
    file's (``apply --replace-hand-edits``: the pristine text of a file
    edited by hand); the change still replaces the file as it is on disk.

    ``reaching`` (model files, with ``names``): plan only the models that can
    reach those files (:func:`patchcraft.planning.selection.plan_reaching`, the
    pre-commit scope), not the whole tree; a named model's own files give
    the same model changes as the whole tree's run (check-draft's copy after
    apply, :mod:`patchcraft.analysis.applied`). The runner and fusion rows
    are the tree's, as without it.
    """
    if tree.engine == "vllm":  # vLLM's runner and layers are not patched: its model rows alone (planning.vllm_plans)
        runner = fusion = False
    rows = (runner_edits.ROW, fusion_transform.ROW)
    model_names = tuple(n for n in names if n.lower() not in rows)
    wanted_rows = {n.lower() for n in names if n.lower() in rows}
    if names and not model_names:
        result = RunResult(mode=mode, tree=tree, version=tree.version, models=(), changes=())
    else:
        planned = replace(tree, only_files=tuple(reaching)) if reaching and model_names else tree
        result = replace(_run_models(planned, mode, model_names, jobs=jobs, base_texts=base_texts), tree=tree)
    extra = ((runner, runner_edits.ROW, runner_row), (fusion, fusion_transform.ROW, fusion_row))
    for enabled, name, rows_of in extra:
        if not enabled or tree.only_files or (wanted_rows and not model_names and name not in wanted_rows):
            continue
        row, changes = rows_of(tree, mode)
        if row is not None:
            result = replace(result, models=result.models + (row,), changes=result.changes + changes)
    return result


def _run_models(
    tree: SglangTree, mode: Mode, names: Sequence[str] = (), jobs: int = 1, base_texts: Mapping[Path, str] | None = None
) -> RunResult:
    """Plan, transform and judge every selected model class."""
    plans = plan_tree(tree, names, whole_files=mode is Mode.REVERT)
    if mode is Mode.REVERT:
        return _run_revert(tree, plans)
    by_file: dict[Path, list[EditSite]] = {}
    for plan in plans:
        for site in plan.sites:
            if site not in by_file.setdefault(site.path, []):
                by_file[site.path].append(site)
    sources: dict[Path, Source] = {}
    patches: dict[Path, FilePatch] = {}
    file_errors: dict[Path, str] = {}
    items = [(path, (sites, (base_texts or {}).get(path))) for path, sites in sorted(by_file.items())]
    for (path, _), (source, patch, error) in zip(items, map_files(_patch_file, items, jobs)):
        if source is not None:
            sources[path] = source
        if patch is not None:
            patches[path] = patch
        if error is not None:
            file_errors[path] = error
    failed, blocked = _failed_models(plans, patches, file_errors)
    # A file that only failed models need is left alone too.
    useful = {s.path for plan in plans if plan.label not in failed and not plan.unsupported for s in plan.sites}
    blocked |= set(patches) - useful
    models = tuple(_judge(tree, mode, plan, patches, file_errors, failed, sources) for plan in plans)
    changes = tuple(
        FileChange(source=sources[path], rel=tree.relative(path), after=patches[path].after)
        for path in sorted(patches)
        if path not in blocked and patches[path].after != sources[path].text
    )
    return RunResult(mode=mode, tree=tree, version=tree.version, models=models, changes=changes)


def _failed_models(
    plans: Sequence[ModelPlan], patches: Mapping[Path, FilePatch], file_errors: Mapping[Path, str]
) -> tuple[dict[str, str], set[Path]]:
    """Models that cannot be patched, including those sharing a capture file with one.

    The inner model's ``__init__`` and ``forward`` edits go together: a flag
    with no capture would feed the draft too few states. So when one model
    fails, the files holding its init and forward sites are not written, and
    that blocks every other model whose init or forward lives there too
    (to a fixpoint). Setter files need no such care: the inserted setter
    block refuses -1 at run time when the inner model lacks the flag. And a
    model whose setter failed blocks nothing but the files with errors: its
    setter is not written, so it never sets the flag, and the init and
    forward it shares with other models (qwen3_moe's, in qwen2_moe.py) are
    written for them (the forward reads the flag with ``getattr``).
    """
    failed: dict[str, str] = {}
    setter_only: set[str] = set()  # its setter failed, so it never sets the flag: its init and forward stay others'
    for plan in plans:
        broken = [
            s for s in plan.sites if file_errors.get(s.path) or patches.get(s.path, FilePatch("")).errors.get(s.key)
        ]
        if broken:
            site = broken[0]
            failed[plan.label] = file_errors.get(site.path) or patches[site.path].errors[site.key]
            if any(s.kind == EditKind.SETTER for s in broken):  # its setter's file has an error: never written
                setter_only.add(plan.label)
    # A file with any error is never written, whoever else it serves.
    blocked: dict[Path, str] = {}
    for plan in plans:
        for site in plan.sites:
            if site.path in file_errors or site.key in patches.get(site.path, FilePatch("")).errors:
                blocked.setdefault(site.path, plan.label)
    because = lambda hit, who: f"{hit}: not written because {who} failed in the same file; fix that first"  # noqa: E731
    # A model whose setter alone failed is not written, so it never sets the flag: the init and forward
    # it shares with others are theirs to write (the flag stays False for it, its capture never runs).
    spread_to_fixpoint(
        failed,
        [
            (plan.label, [] if plan.label in setter_only else [s.path for s in plan.sites if s.kind != EditKind.SETTER])
            for plan in plans
        ],
        blocked,
        because,
    )
    for plan in plans:
        hit = next((f for f in plan.files if f in blocked), None)
        if plan.label not in failed and hit is not None:
            failed[plan.label] = f"{hit}: not written because {blocked[hit]} failed in the same file; fix that first"
    return failed, set(blocked)


def spread_to_fixpoint(
    failed: dict[str, str],
    files: Sequence[tuple[str, Sequence[K]]],
    blocked: dict[K, str],
    because: Callable[[K, str], str],
    catches: Callable[[str], bool] = lambda label: True,
) -> None:
    """The one rule behind "a file is written whole or not at all", for the engine and for the harness.

    Every file of a failed model is blocked (``blocked[file] = who``); a
    model that ``catches`` and has a blocked file fails in turn, with
    ``because(file, who)`` as its reason; to a fixpoint. ``failed`` and
    ``blocked`` are updated in place, in the order of ``files``.
    """
    changed = True
    while changed:
        changed = False
        for label, paths in files:
            hit = next((f for f in paths if f in blocked), None)
            if label not in failed and hit is not None and catches(label):
                failed[label] = because(hit, blocked[hit])
            if label in failed:
                for f in paths:
                    if f not in blocked:
                        blocked[f] = label
                        changed = True


def _judge(tree, mode, plan, patches, file_errors, failed, sources) -> ModelResult:
    rel = tree.relative(plan.path)
    files = tuple(tree.relative(f) for f in plan.files)
    if plan.unsupported:
        skipped = ModelStatus.NOT_APPLICABLE if plan.not_applicable else ModelStatus.UNSUPPORTED
        return ModelResult(
            model=plan.label, path=rel, status=skipped, message=plan.unsupported, files=files, notes=plan.notes
        )
    edits = []
    for site in plan.sites:
        outcome = patches[site.path].outcomes.get(site.key) if site.path in patches else None
        why = "" if outcome else (file_errors.get(site.path) or patches[site.path].errors.get(site.key, ""))
        edits.append(edit_result(tree, site, BY_KIND[site.kind].NAME, outcome, why))
    all_present = all(e.status in EDIT_IN_PLACE for e in edits)
    compiled = all(compiles(sources[f]) for f in plan.files if f in sources) if mode is Mode.VERIFY else None
    common = dict(
        model=plan.label, path=rel, edits=tuple(edits), files=files, notes=plan.notes, included_by=plan.included_by
    )
    if plan.label in failed:
        return ModelResult(**common, status=ModelStatus.ERROR, message=failed[plan.label], compiles=compiled)
    if all_present:
        hand = any(e.status == EditStatus.HAND_APPLIED for e in edits)
        message = "patched (hand-applied edits recognised)" if hand else "patched"
        return ModelResult(**common, status=ModelStatus.ALREADY, message=message, compiles=compiled, idempotent=True)
    missing = _kinds([e for e in edits if e.status == EditStatus.APPLIED], rel)
    if mode is Mode.APPLY:
        return ModelResult(**common, status=ModelStatus.PATCHED, message=f"added: {missing}{_included(plan)}")
    return ModelResult(
        **common,
        status=ModelStatus.WOULD,
        message=f"missing: {missing}{_included(plan)}",
        compiles=compiled,
        idempotent=False if mode is Mode.VERIFY else None,
    )


def _kinds(edits: Sequence[EditResult], own: str) -> str:
    """``setter, init, forward``; ``init (3 classes)`` when the flag goes into several ``__init__``.

    An edit made in another file than the model's own says where it went:
    ``forward via deepseek_v2.py DeepseekV2Model`` (a wrapper such as
    Kimi-K2.5 whose inner model lives elsewhere; its own file is untouched).
    """
    kinds = [e.kind for e in edits]
    words = []
    for kind in dict.fromkeys(kinds):
        these = [e for e in edits if e.kind == kind]
        if all(e.file == own for e in these):
            words.append(kind if len(these) == 1 else f"{kind} ({len(these)} classes)")
        elif len(these) == 1:
            words.append(f"{kind} via {os.path.basename(these[0].file)} {these[0].cls}")
        else:
            files = ", ".join(dict.fromkeys(os.path.basename(e.file) for e in these))
            words.append(f"{kind} ({len(these)} classes, in {files})")
    return ", ".join(words)


def _included(plan: ModelPlan) -> str:
    return f" (not named, but {plan.included_by})" if plan.included_by else ""


def _patch_file(
    item: tuple[Path, tuple[Sequence[EditSite], str | None]],
) -> tuple[Source | None, FilePatch | None, str | None]:
    """Read and patch one file (or its ``base`` text instead): (source, patch, error); runs in a worker process when ``jobs`` > 1."""
    path, (sites, base) = item
    source = patch = error = None
    try:
        source = read_source(path)
        patch = patch_text(source.text if base is None else base, path, sites)
    except PatchcraftError as exc:
        error = str(exc)
    return source, patch, error


def _run_revert(tree: SglangTree, plans: Sequence[ModelPlan]) -> RunResult:
    files = sorted({site.path for plan in plans for site in plan.sites})
    changes = []
    reverted: set[Path] = set()
    for path in files:
        source = read_source(path)
        after = revert_text(source.text, path)
        if after != source.text:
            changes.append(FileChange(source=source, rel=tree.relative(path), after=after))
            reverted.add(path)
    models = []
    for plan in plans:
        status = (
            (ModelStatus.NOT_APPLICABLE if plan.not_applicable else ModelStatus.UNSUPPORTED)
            if plan.unsupported
            else (ModelStatus.REVERTED if set(plan.files) & reverted else ModelStatus.NOT_PATCHED)
        )
        message = plan.unsupported or (
            "patchcraft edits removed" if status == ModelStatus.REVERTED else "no patchcraft edits found"
        )
        if plan.included_by and status == ModelStatus.REVERTED:
            why = (
                "revert gives back whole files"  # vLLM's edits read no flag: one file serves them all
                if tree.engine == "vllm"
                else "reverting one without the other would leave a forward reading a flag no __init__ sets"
            )
            message += f" (not named, but {plan.included_by}: {why})"
        models.append(
            ModelResult(
                model=plan.label,
                path=tree.relative(plan.path),
                status=status,
                message=message,
                files=tuple(tree.relative(f) for f in plan.files),
                included_by=plan.included_by,
            )
        )
    return RunResult(mode=Mode.REVERT, tree=tree, version=tree.version, models=tuple(models), changes=tuple(changes))


def withhold(result: RunResult, verdicts: Mapping[str, ProofVerdict]) -> RunResult:
    """Record each model's proof (``label -> verdict``) and drop what failed it.

    A model whose proof withholds it (:data:`~patchcraft.base.status.WITHHELD`)
    is not written, nor is any file it would change; a file is written whole
    or not at all, so every other model patching one of those files is
    withheld too (its other files would hold half its patch), to a fixpoint.
    Their rows say why.
    """
    reasons = {label: v.reason for label, v in verdicts.items() if v.proof in WITHHELD}
    blocked: dict[str, str] = {}
    patched = {m.model for m in result.models if m.status == ModelStatus.PATCHED}
    spread_to_fixpoint(
        reasons,
        [(m.model, m.files) for m in result.models],
        blocked,
        lambda hit, who: f"{hit} is withheld because the harness did not prove {who}",
        catches=patched.__contains__,
    )
    models = []
    for model in result.models:
        verdict = verdicts.get(model.model)
        proof = verdict.proof if verdict is not None else model.proof
        harness = verdict.harness if verdict is not None else model.harness
        if model.model in reasons:
            status = ModelStatus.WOULD if model.status == ModelStatus.PATCHED else model.status
            message = (
                f"not written: {reasons[model.model]}"
                if model.status == ModelStatus.PATCHED
                else f"{model.message}; but {reasons[model.model]}"
            )
            models.append(replace(model, status=status, message=message, proof=proof or Proof.FAILED, harness=harness))
        else:
            models.append(replace(model, proof=proof, harness=harness))
    changes = tuple(c for c in result.changes if c.rel not in blocked)
    return replace(result, models=tuple(models), changes=changes)


def withhold_unnamed(result: RunResult, names: Sequence[str]) -> RunResult:
    """With ``--model``: when every named model is withheld or in ``error``, nothing else is written either.

    The runner and all-reduce fusion rows (and any model brought along) exist
    only to serve the named models; written alone they would change the
    install for models that stay unpatched. Their rows say why.
    """
    named = [m for m in result.models if is_named(m.model, names)]
    if not names or not named or not all(_held(result, m) for m in named):
        return result
    who = ", ".join(m.model for m in named)
    why = "which cannot be patched" if all(m.status == ModelStatus.ERROR for m in named) else "which is not written"
    if any(m.proof in WITHHELD for m in named):
        why = "which the harness did not prove"
    models = tuple(
        replace(m, status=ModelStatus.WOULD, message=f"not written: it serves {who}, {why}")
        if m.status == ModelStatus.PATCHED
        else m
        for m in result.models
    )
    return replace(result, models=models, changes=())


def _held(result: RunResult, model: ModelResult) -> bool:
    """Withheld (its own proof, or a file shared with a model that failed it: an apply that would
    patch it leaves it ``would-patch``), or in ``error``."""
    if model.proof in WITHHELD or model.status == ModelStatus.ERROR:
        return True
    return result.mode is Mode.APPLY and model.status == ModelStatus.WOULD


def claim_written(result: RunResult) -> RunResult:
    """Each tree row claims only what this run writes: the fusion row names the models whose marks it writes."""
    done = [m for m in result.models if m.status in (ModelStatus.PATCHED, ModelStatus.ALREADY)]
    written = {m.model for m in done}
    marks = {(e.file, e.cls) for m in done for e in m.edits if e.kind == EditKind.FUSION_MARK}
    models = tuple(fusion_claim(m, written.__contains__, lambda f, c: (f, c) in marks) for m in result.models)
    return result if models == result.models else replace(result, models=models)


def write_changes(changes: Sequence[FileChange]) -> None:
    """Write every change atomically, all or none; check all are writable before writing any."""
    for change in changes:
        check_writable(change.source.path)
    write_all([(change.source, change.after) for change in changes])
