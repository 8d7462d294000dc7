"""The pure core: plan, transform and judge; it returns records and never prints.

``patch_text`` (str -> str plus outcomes) is the innermost layer, then
``run`` builds a :class:`RunResult` for a whole tree in one of the modes
below. Writing files is left to :func:`write_changes`, so ``--check``,
``diff`` and ``verify`` share every step with ``apply`` except the last.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from patchcraft import MARKER, runner_plan
from patchcraft.errors import PatchcraftError
from patchcraft.graph import EditSite, ModelPlan, parse_python
from patchcraft.selection import plan_tree
from patchcraft.sources import Source, check_writable, read_source, write_all
from patchcraft.tree import SglangTree
from patchcraft.workers import gc_paused, map_files

if TYPE_CHECKING:
    import libcst as cst

    from patchcraft.transforms import BY_KIND, RUNNER_TRANSFORMS
    from patchcraft.transforms import configure_ids_before_graphs as runner_transform
    from patchcraft.transforms import keep_captured_states_reduced as fusion_transform
    from patchcraft.transforms._base import ClassSlices, Outcome, RemoveMarked, code_with_ending, marked_classes
else:
    # libcst and the transforms load on first use: a run answered from the
    # result cache (patchcraft.cache) needs neither (docs/performance.md).
    from patchcraft.lazy import Deferred

    cst = Deferred("libcst")
    BY_KIND = Deferred("patchcraft.transforms", "BY_KIND")
    RUNNER_TRANSFORMS = Deferred("patchcraft.transforms", "RUNNER_TRANSFORMS")
    runner_transform = Deferred("patchcraft.transforms.configure_ids_before_graphs")
    fusion_transform = Deferred("patchcraft.transforms.keep_captured_states_reduced")
    ClassSlices = Deferred("patchcraft.transforms._base", "ClassSlices")
    Outcome = Deferred("patchcraft.transforms._base", "Outcome")
    RemoveMarked = Deferred("patchcraft.transforms._base", "RemoveMarked")
    marked_classes = Deferred("patchcraft.transforms._base", "marked_classes")
    code_with_ending = Deferred("patchcraft.transforms._base", "code_with_ending")


class Mode(enum.Enum):
    APPLY = "apply"
    CHECK = "check"
    DIFF = "diff"
    VERIFY = "verify"
    REVERT = "revert"


# Model statuses (the JSON schema's `status`).
PATCHED = "patched"
ALREADY = "already-patched"
WOULD = "would-patch"
UNSUPPORTED = "unsupported"
ERROR = "error"
REVERTED = "reverted"
CLEAN = "not-patched"
#: The runner row on a release whose graph capture already gets the configured ids.
NOT_NEEDED = "not-needed"
#: A class with the setter that is no EAGLE-3 target (a draft or NextN head capturing nothing).
NOT_APPLICABLE = "not-applicable"


@dataclass(frozen=True)
class EditResult:
    kind: str
    transform: str
    file: str
    cls: str
    method: str
    status: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("applied", "present", "hand-applied")


@dataclass(frozen=True)
class ModelResult:
    model: str
    path: str
    status: str
    edits: tuple[EditResult, ...] = ()
    message: str = ""
    files: tuple[str, ...] = ()
    compiles: bool | None = None
    idempotent: bool | None = None
    notes: tuple[str, ...] = ()
    #: Why a model not named with ``--model`` is in the run (see :func:`select`).
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


@dataclass
class FilePatch:
    """The result of patching one file's text: new text and one outcome per site."""

    after: str
    outcomes: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)


# -- str -> str ----------------------------------------------------------------

def parse(text: str, path: Path) -> cst.Module:
    """Parse a whole file, or a class or method cut out of it and padded to its place
    (line numbers, in the message of a syntax error too, are then the file's)."""
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise PatchcraftError(
            f"{path}: syntax error at line {exc.raw_line}: {exc.message}; nothing was changed"
        ) from None


def _slices(text: str, path: Path, cut: Callable[..., ClassSlices | None], wanted: Iterable) -> ClassSlices | None:
    """``cut(text, wanted, parse)``: ClassSlices.of (class names) or .of_methods ((class, method) pairs)."""
    try:
        return cut(text, wanted, lambda segment, first: parse(segment, path))
    except SyntaxError as exc:
        raise PatchcraftError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}; nothing was changed") from None


def patch_text(text: str, path: Path, sites: Sequence[EditSite], transforms: Mapping[str, Any] | None = None) -> FilePatch:
    """Apply the transform of each site (``transforms[site.kind]``, the model transforms
    by default) to ``text``. Errors are recorded per site.

    Only the methods holding the sites are parsed, each with its class
    header (big files are slow in libcst); when a method is missing, defined
    twice or nested in a statement, its whole class is, and when a class is
    missing or defined twice, the whole module is, so that the transform
    reports the anchor problem itself.
    """
    transforms = BY_KIND if transforms is None else transforms
    slices = _slices(text, path, ClassSlices.of_methods, [(site.cls, site.method) for site in sites])
    modules = slices.modules if slices is not None else {None: parse(text, path)}
    patch = FilePatch(after=text)
    for site in sites:
        key = slices.key(site.cls, site.method) if slices is not None else None
        try:
            modules[key], outcome = transforms[site.kind].apply(modules[key], site)
        except PatchcraftError as exc:
            patch.errors[site.key] = str(exc)
            continue
        patch.outcomes[site.key] = outcome
        if outcome.status == "modified":
            patch.errors[site.key] = (
                f"{site.path}: {site.cls}.{site.method}: {outcome.detail}; "
                "fix or remove that block by hand, then re-run (file left untouched)"
            )
    if not patch.errors and all(o.status in ("present", "hand-applied") for o in patch.outcomes.values()):
        patch.after = text  # nothing was edited: libcst would print the same text back, slowly
    else:
        patch.after = slices.text() if slices is not None else code_with_ending(modules[None], text)
    return patch


def revert_text(text: str, path: Path) -> str:
    """Remove every statement patchcraft inserted; the inverse of ``apply``."""
    try:
        names = marked_classes(text)
    except SyntaxError:
        names = None  # parse() below reports it
    if names == []:
        return text  # no patchcraft text at all
    slices = _slices(text, path, ClassSlices.of, names) if names else None
    if slices is None:
        return code_with_ending(_revert_module(parse(text, path), text), text)
    for name, module in slices.modules.items():
        slices.modules[name] = _revert_module(module, slices.segment(name))
    return slices.text()


def _revert_module(module: cst.Module, text: str) -> cst.Module:
    remover = RemoveMarked()
    module = module.visit(remover)
    if text.count(MARKER) > remover.removed_markers:
        # Marker text outside the removed statements: calls whose arguments patchcraft changed.
        for transform in RUNNER_TRANSFORMS:
            module = transform.revert(module)
    return module


# -- whole tree ----------------------------------------------------------------

@gc_paused
def run(tree: SglangTree, mode: Mode, names: Sequence[str] = (), runner: bool = True, jobs: int = 1, fusion: bool = True) -> RunResult:
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
    """
    rows = (runner_plan.ROW, fusion_transform.ROW)
    model_names = tuple(n for n in names if n.lower() not in rows)
    wanted_rows = {n.lower() for n in names if n.lower() in rows}
    if names and not model_names:
        result = RunResult(mode=mode, tree=tree, version=tree.version, models=(), changes=())
    else:
        result = _run_models(tree, mode, model_names, jobs=jobs)
    extra = ((runner, runner_plan.ROW, _runner_results), (fusion, fusion_transform.ROW, _fusion_results))
    for enabled, name, rows_of in extra:
        if not enabled or tree.only_files or (wanted_rows and not model_names and name not in wanted_rows):
            continue
        row, changes = rows_of(tree, mode)
        if row is not None:
            result = replace(result, models=result.models + (row,), changes=result.changes + changes)
    return result


def _run_models(tree: SglangTree, mode: Mode, names: Sequence[str] = (), jobs: int = 1) -> RunResult:
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
    items = sorted(by_file.items())
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
    block refuses -1 at run time when the inner model lacks the flag.
    """
    failed: dict[str, str] = {}
    for plan in plans:
        for site in plan.sites:
            message = file_errors.get(site.path) or patches.get(site.path, FilePatch("")).errors.get(site.key)
            if message:
                failed.setdefault(plan.label, message)
    # A file with any error is never written, whoever else it serves.
    blocked: dict[Path, str] = {}
    for plan in plans:
        for site in plan.sites:
            if site.path in file_errors or site.key in patches.get(site.path, FilePatch("")).errors:
                blocked.setdefault(site.path, plan.label)
    changed = True
    while changed:
        changed = False
        for plan in plans:
            capture_files = [s.path for s in plan.sites if s.kind != "setter"]
            hit = next((f for f in capture_files if f in blocked), None)
            if plan.label not in failed and hit is not None:
                failed[plan.label] = f"{hit}: not written because {blocked[hit]} failed in the same file; fix that first"
            if plan.label in failed:
                for f in capture_files:
                    if f not in blocked:
                        blocked[f] = plan.label
                        changed = True
    for plan in plans:
        hit = next((f for f in plan.files if f in blocked), None)
        if plan.label not in failed and hit is not None:
            failed[plan.label] = f"{hit}: not written because {blocked[hit]} failed in the same file; fix that first"
    return failed, set(blocked)


def _judge(tree, mode, plan, patches, file_errors, failed, sources) -> ModelResult:
    rel = tree.relative(plan.path)
    files = tuple(tree.relative(f) for f in plan.files)
    if plan.unsupported:
        status = NOT_APPLICABLE if plan.not_applicable else UNSUPPORTED
        return ModelResult(model=plan.label, path=rel, status=status, message=plan.unsupported, files=files, notes=plan.notes)
    edits = []
    for site in plan.sites:
        transform = BY_KIND[site.kind]
        outcome = patches[site.path].outcomes.get(site.key) if site.path in patches else None
        status = outcome.status if outcome else "error"
        detail = outcome.detail if outcome else (file_errors.get(site.path) or patches[site.path].errors.get(site.key, ""))
        edits.append(EditResult(site.kind, transform.NAME, tree.relative(site.path), site.cls, site.method, status, detail))
    all_present = all(e.status in ("present", "hand-applied") for e in edits)
    compiles = None
    if mode is Mode.VERIFY:
        compiles = all(_compiles(sources[f]) for f in plan.files if f in sources)
    common = dict(model=plan.label, path=rel, edits=tuple(edits), files=files, notes=plan.notes, included_by=plan.included_by)
    if plan.label in failed:
        return ModelResult(**common, status=ERROR, message=failed[plan.label], compiles=compiles)
    if all_present:
        hand = any(e.status == "hand-applied" for e in edits)
        message = "patched (hand-applied edits recognised)" if hand else "patched"
        return ModelResult(**common, status=ALREADY, message=message, compiles=compiles, idempotent=True)
    missing = _kinds([e.kind for e in edits if e.status == "applied"])
    if mode is Mode.APPLY:
        return ModelResult(**common, status=PATCHED, message=f"added: {missing}{_included(plan)}")
    return ModelResult(**common, status=WOULD, message=f"missing: {missing}{_included(plan)}", compiles=compiles, idempotent=False if mode is Mode.VERIFY else None)


def _kinds(kinds: Sequence[str]) -> str:
    """``setter, init, forward``; ``init (3 classes)`` when the flag goes into several ``__init__``."""
    return ", ".join(k if kinds.count(k) == 1 else f"{k} ({kinds.count(k)} classes)" for k in dict.fromkeys(kinds))


def _included(plan: ModelPlan) -> str:
    return f" (not named, but {plan.included_by})" if plan.included_by else ""


def _patch_file(item: tuple[Path, Sequence[EditSite]]) -> tuple[Source | None, FilePatch | None, str | None]:
    """Read and patch one file: (source, patch, error); runs in a worker process when ``jobs`` > 1."""
    path, sites = item
    source = patch = error = None
    try:
        source = read_source(path)
        patch = patch_text(source.text, path, sites)
    except PatchcraftError as exc:
        error = str(exc)
    return source, patch, error


@functools.lru_cache(maxsize=64)  # a file shared by several models is compiled once
def _compiles(source: Source) -> bool:
    """Whether the file compiles: its ``ast`` tree, parsed once for planning, is compiled."""
    try:
        compile(parse_python(source.text), str(source.path), "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False


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
        status = (NOT_APPLICABLE if plan.not_applicable else UNSUPPORTED) if plan.unsupported else (REVERTED if set(plan.files) & reverted else CLEAN)
        message = plan.unsupported or ("patchcraft edits removed" if status == REVERTED else "no patchcraft edits found")
        if plan.included_by and status == REVERTED:
            message += f" (not named, but {plan.included_by}: reverting one without the other would leave a forward reading a flag no __init__ sets)"
        models.append(ModelResult(model=plan.label, path=tree.relative(plan.path), status=status, message=message, files=tuple(tree.relative(f) for f in plan.files), included_by=plan.included_by))
    return RunResult(mode=Mode.REVERT, tree=tree, version=tree.version, models=tuple(models), changes=tuple(changes))


# -- the model runner: graph capture gets the configured ids ----------------------

def _runner_results(tree: SglangTree, mode: Mode) -> tuple[ModelResult | None, tuple[FileChange, ...]]:
    """The ``runner`` row and its changes (none for a tree without ``model_executor/``).

    The runner edits go together, like a model's: if one site fails, no
    runner file is written.
    """
    directory = tree.executor_dir
    if not directory.is_dir():
        return None, ()
    row: dict[str, Any] = dict(model=runner_plan.ROW, path=tree.relative(directory))
    if mode is Mode.REVERT:
        return _revert_runner(tree, row)
    try:
        plan = runner_plan.plan_runner(directory)
    except PatchcraftError as exc:
        return ModelResult(**row, status=ERROR, message=str(exc)), ()
    if plan.not_needed:
        return ModelResult(**row, status=NOT_NEEDED, message=plan.not_needed), ()
    if plan.unsupported or plan.runner is None:
        return ModelResult(**row, status=UNSUPPORTED, message=plan.unsupported or "no model runner found"), ()
    row["path"] = tree.relative(plan.runner)
    sources: dict[Path, Source] = {}
    afters: dict[Path, str] = {}
    edits: list[EditResult] = []
    errors: list[str] = []
    for path in plan.files:
        try:
            sources[path] = read_source(path)
            sites = [s for s in plan.sites if s.path == path]
            patch = patch_text(sources[path].text, path, sites, {runner_plan.KIND: runner_transform})
        except PatchcraftError as exc:
            errors.append(str(exc))
            continue
        for site in sites:
            outcome = patch.outcomes.get(site.key)
            if outcome is not None:
                edits.append(EditResult(site.kind, runner_transform.NAME, tree.relative(path), site.cls, site.method, outcome.status, outcome.detail))
        errors.extend(patch.errors.values())
        afters[path] = patch.after
    files = tuple(tree.relative(f) for f in plan.files)
    notes = tuple(f"{e.file}: {e.cls}.{e.method}" for e in edits)
    common: dict[str, Any] = dict(row, edits=tuple(edits), files=files, notes=notes)
    compiles = all(_compiles(src) for src in sources.values()) if mode is Mode.VERIFY else None
    if errors:
        return ModelResult(**common, status=ERROR, message=errors[0]), ()
    changes = tuple(
        FileChange(source=sources[p], rel=tree.relative(p), after=afters[p]) for p in plan.files if afters[p] != sources[p].text
    )
    if all(e.status in ("present", "hand-applied") for e in edits):
        hand = " (hand-applied edits recognised)" if any(e.status == "hand-applied" for e in edits) else ""
        return ModelResult(**common, status=ALREADY, message=f"configured ids reach graph capture{hand}", compiles=compiles, idempotent=True), ()
    if mode is Mode.APPLY:
        return ModelResult(**common, status=PATCHED, message="added: configured ids reach graph capture"), changes
    missing = sum(e.status == "applied" for e in edits)
    message = f"missing: graph capture resets the ids to the defaults ({missing} of {len(edits)} edits to make)"
    return ModelResult(**common, status=WOULD, message=message, compiles=compiles, idempotent=False if mode is Mode.VERIFY else None), changes


def _revert_runner(tree: SglangTree, row: dict) -> tuple[ModelResult, tuple[FileChange, ...]]:
    changes = []
    for path in sorted(tree.executor_dir.rglob("*.py")):
        try:
            if MARKER.encode() not in path.read_bytes():
                continue
        except OSError:
            continue
        source = read_source(path)
        after = revert_text(source.text, path)
        if after != source.text:
            changes.append(FileChange(source=source, rel=tree.relative(path), after=after))
    files = tuple(c.rel for c in changes)
    if changes:
        return ModelResult(**row, status=REVERTED, message="patchcraft edits removed", files=files), tuple(changes)
    return ModelResult(**row, status=CLEAN, message="no patchcraft edits found"), ()


# -- all-reduce fusion: captured states stay reduced at TP > 1 ---------------------

def _fusion_results(tree: SglangTree, mode: Mode) -> tuple[ModelResult | None, tuple[FileChange, ...]]:
    """The ``allreduce-fusion`` row and its change (none for a tree without ``srt/layers/``'s decision).

    ``not-needed`` where no model both defers its all-reduce and captures
    ``hidden_states + residual``, or where the release reduces at layer
    boundaries (``srt/layers/layer_boundary``, 0.5.21 on). A partial copy of
    a release (no ``communicator.py``, no ``layer_boundary``) gets no row.
    """
    path = fusion_transform.communicator_path(tree.package)
    row = dict(model=fusion_transform.ROW, path=tree.relative(path))
    if not path.is_file():
        boundary = tree.package / "srt" / "layers" / "layer_boundary"
        if boundary.is_dir():
            return ModelResult(**dict(row, path=tree.relative(boundary)), status=NOT_NEEDED, message="not needed: layers reduce at the layer boundary, before any capture (srt/layers/layer_boundary)"), ()
        return None, ()
    if mode is Mode.REVERT:
        source = read_source(path)
        after = revert_text(source.text, path) if MARKER in source.text else source.text
        if after != source.text:
            return ModelResult(**row, status=REVERTED, message="patchcraft edits removed", files=(row["path"],)), (FileChange(source=source, rel=row["path"], after=after),)
        return ModelResult(**row, status=CLEAN, message="no patchcraft edits found"), ()
    try:
        plan = fusion_transform.plan(tree.package, tree.models_dir)
    except PatchcraftError as exc:
        return ModelResult(**row, status=ERROR, message=str(exc)), ()
    notes = tuple(f"captures partial sums: {tree.relative(p)}" for p in plan.affected)
    if plan.not_needed:
        return ModelResult(**row, status=NOT_NEEDED, message=plan.not_needed), ()
    if plan.unsupported or plan.site is None:
        return ModelResult(**row, status=UNSUPPORTED, message=plan.unsupported or "no decision found", notes=notes), ()
    site = plan.site
    try:
        source = read_source(path)
        patch = patch_text(source.text, path, [site], {fusion_transform.KIND: fusion_transform})
    except PatchcraftError as exc:
        return ModelResult(**row, status=ERROR, message=str(exc), notes=notes), ()
    outcome = patch.outcomes.get(site.key)
    files = (row["path"],)
    edits = (EditResult(site.kind, fusion_transform.NAME, row["path"], site.cls, site.method, outcome.status if outcome else "error", outcome.detail if outcome else ""),)
    common = dict(row, edits=edits, files=files, notes=notes)
    compiles = _compiles(source) if mode is Mode.VERIFY else None
    if patch.errors:
        return ModelResult(**common, status=ERROR, message=next(iter(patch.errors.values()))), ()
    assert outcome is not None
    if outcome.status in ("present", "hand-applied"):
        hand = " (hand-applied edits recognised)" if outcome.status == "hand-applied" else ""
        return ModelResult(**common, status=ALREADY, message=f"EAGLE-3 captures reduced states at TP > 1{hand}", compiles=compiles, idempotent=True), ()
    changes = (FileChange(source=source, rel=row["path"], after=patch.after),)
    if mode is Mode.APPLY:
        return ModelResult(**common, status=PATCHED, message="added: EAGLE-3 turns off the deferred all-reduce (captured states stay reduced)"), changes
    message = "missing: at TP > 1 with all-reduce fusion, captured layer states are per-rank partial sums"
    return ModelResult(**common, status=WOULD, message=message, compiles=compiles, idempotent=False if mode is Mode.VERIFY else None), changes


def withhold(result: RunResult, verdicts: Mapping[str, tuple[str, str]]) -> RunResult:
    """Record each model's proof (``label -> (proof, detail)``) and drop what failed it.

    A model whose proof is ``harness-failed`` is not written, nor is any
    file it would change; a file is written whole or not at all, so every
    other model patching one of those files is withheld too (its other
    files would hold half its patch), to a fixpoint. Their rows say why.
    """
    reasons = {label: detail for label, (proof, detail) in verdicts.items() if proof == "harness-failed"}
    blocked: dict[str, str] = {}
    grown = True
    while grown:
        grown = False
        for model in result.models:
            if model.model not in reasons:
                hit = next((f for f in model.files if f in blocked), None) if model.status == PATCHED else None
                if hit is None:
                    continue
                reasons[model.model] = f"{hit} is withheld because {blocked[hit]} failed the harness"
            for path in model.files:
                if path not in blocked:
                    blocked[path] = model.model
                    grown = True
    models = []
    for model in result.models:
        proof = verdicts[model.model][0] if model.model in verdicts else model.proof
        if model.model in reasons:
            status = WOULD if model.status == PATCHED else model.status
            message = f"not written: {reasons[model.model]}" if model.status == PATCHED else f"{model.message}; but {reasons[model.model]}"
            models.append(replace(model, status=status, message=message, proof=proof or "harness-failed"))
        else:
            models.append(replace(model, proof=proof))
    changes = tuple(c for c in result.changes if c.rel not in blocked)
    return replace(result, models=tuple(models), changes=changes)


def write_changes(changes: Sequence[FileChange]) -> None:
    """Write every change atomically, all or none; check all are writable before writing any."""
    for change in changes:
        check_writable(change.source.path)
    write_all([(change.source, change.after) for change in changes])
