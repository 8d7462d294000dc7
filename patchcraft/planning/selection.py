"""Which plans a run covers: ``--model`` names, the files named, and what they share.

:func:`plan_tree` is the planning layer's entry point for a run. It plans
the whole tree, or, for a few model files (the pre-commit case), only what
can reach them (:func:`plan_reaching`), and :func:`select` closes the
choice over shared edit sites and files so that no file is left half
patched and no patched ``forward`` reads a flag no ``__init__`` sets.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.planning.records import ModelPlan
from patchcraft.planning.model_plans import plan_models, scan
from patchcraft.planning.vllm_plans import is_vllm, plan_vllm
from patchcraft.reading.vllm_graph import SETTER as VLLM_SETTER
from patchcraft.reading.prefilter import ModelTexts, Reach, import_map, importers, read_models
from patchcraft.base.target import SglangTree
from patchcraft.base.status import EditKind


def plan_tree(tree: SglangTree, names: Sequence[str] = (), whole_files: bool = False) -> list[ModelPlan]:
    """The plans of the models a run covers (:func:`select`), in plan order."""
    if not tree.models_dir.is_dir():
        raise PatchcraftError(f"{tree.package}: not an SGLang tree (no srt/models)")
    if is_vllm(tree):  # vLLM's targets and their one edit (planning.vllm_plans); selected as SGLang's
        plans = select(plan_vllm(tree), tree, names, whole_files)
        if names and not plans:
            raise PatchcraftError(f"{tree.models_dir}: {no_match(tree.models_dir, names, VLLM_SETTER)}")
        return plans
    # Only what can reach the files named (the pre-commit case): the same plans as the whole tree's.
    scoped = plan_reaching(tree, names, whole_files) if tree.only_files else None
    plans = (
        scoped
        if scoped is not None
        else select(plan_models(scan(tree.models_dir), inheriting=True), tree, names, whole_files)
    )
    if names and not plans:
        raise PatchcraftError(f"{tree.models_dir}: {no_match(tree.models_dir, names)}")
    return plans


def is_named(label: str, names: Sequence[str]) -> bool:
    """Whether ``--model`` names this row itself (a file stem, a class, ``module.Class`` or ``runner``; a vLLM
    family row ``kimi_k3.nvidia.Class`` is named by its family ``kimi_k3`` too)."""
    wanted = {n.lower().removesuffix(".py") for n in names}
    module, _, cls = label.lower().rpartition(".")
    return bool(wanted & {label.lower(), module, module.partition(".")[0], cls})


def no_match(models_dir: Path, names: Sequence[str], setter: str = "set_eagle3_layers_to_capture") -> str:
    """Why no model answers ``--model NAME``: a model file without an EAGLE-3 setter, or no such file, and the nearest names."""
    said = []
    for name in names:
        stem = name.removesuffix(".py").split(".")[0]
        if (models_dir / f"{stem}.py").is_file():
            said.append(
                f"{stem}.py is in this tree, but none of its classes has {setter} "
                "(itself or through a base class): this tree serves no EAGLE-3 target from it"
            )
            continue
        near = nearest(models_dir, name)
        said.append(
            f"no model file {stem}.py and no model class {name} in this tree"
            + (f"; the nearest names: {', '.join(near)}" if near else "")
        )
    return f"no model matches --model {', '.join(names)}: " + "; ".join(said)


def nearest(models_dir: Path, name: str, count: int = 3) -> list[str]:
    """The model files (stems) of ``models_dir`` closest to ``name`` (difflib), best first."""
    import difflib

    stems = sorted(p.stem for p in models_dir.glob("*.py") if not p.name.startswith("_"))
    return difflib.get_close_matches(name.removesuffix(".py").split(".")[0].lower(), stems, n=count, cutoff=0.6)


def plan_reaching(tree: SglangTree, names: Sequence[str] = (), whole_files: bool = False) -> list[ModelPlan] | None:
    """``select(plan_models(scan(...)), tree, names, whole_files)`` without planning the whole tree.

    The plans that meet ``tree.only_files`` are closed over the files they
    share (:func:`select`). A plan's sites are found by following imports
    from its class's file, so only the classes of those files and of the
    files importing them (transitively) can meet them; of those files only
    the ones that may hold a class with the setter are parsed
    (:class:`~patchcraft.reading.prefilter.Reach`). When the plans chosen reach
    further, the scope grows and planning runs again. None when a file lies
    outside the models directory (plan the whole tree then).
    """
    models_dir = tree.models_dir
    models = models_dir.resolve()
    wanted = {path.resolve() for path in tree.only_files}
    if not wanted or any(path.parent != models for path in wanted):
        return None
    texts = ModelTexts(read_models(models_dir))
    imports = import_map(texts)
    reach = Reach(ModelGraph(models_dir=models_dir), texts)
    first = set(wanted)  # the files named: an inheriting entry class's row is asked for only by these
    while True:
        reach.load(importers(imports, {path.stem for path in wanted}))
        scope = replace(tree, only_files=tuple(sorted(wanted)))
        chosen = select(plan_models(reach.graph, inheriting=True), scope, names, whole_files)
        touched = wanted | {path.resolve() for plan in chosen for path in (*plan.files, plan.path)}
        if touched <= wanted:
            return [p for p in chosen if not p.inherits or p.path.resolve() in first or named([p], names)]
        wanted = touched


def select(
    plans: Iterable[ModelPlan], tree: SglangTree, names: Sequence[str], whole_files: bool = False
) -> list[ModelPlan]:
    """The plans ``names`` pick, closed over what they share with the others.

    A model named with ``--model`` brings along every model that shares one
    of its edit sites (``whole_files``: one of its files): patching
    ``DeepseekV2Model.forward`` for deepseek_v2 changes Glm4MoeLite, whose
    own ``__init__`` must then set the flag that forward reads, or its
    server crashes on the first forward. Revert works on whole files, so it
    closes over files. Each model brought along says why (``included_by``).

    A row for an entry class that only inherits another's setter and sites
    (``inherits``) is part of the run only when named, or when its file is
    and holds no model class of its own (``mellum.py``, not ``llama.py``).
    """
    plans = list(plans)
    resolve = _Resolved()
    own = [p for p in plans if not p.inherits]
    files = {resolve(path) for path in tree.only_files} - {resolve(p.path) for p in own}
    asked = [p for p in plans if p.inherits and resolve(p.path) in files]
    chosen = named(plans, names) if names else own + asked
    if names:
        chosen = _closure(chosen, own + [p for p in chosen if p.inherits], whole_files, resolve)
    return _touching(chosen, set(tree.only_files)) if tree.only_files else chosen


def named(plans: Iterable[ModelPlan], names: Sequence[str]) -> list[ModelPlan]:
    """The plans ``names`` name (a model file stem, a class, or ``module.Class``); all without names.

    An inheriting entry class's row (``inherits``) counts only for a name
    no model class of its own answers (``--model mellum``, not ``--model llama``).
    """
    wanted = {n.lower().removesuffix(".py") for n in names}
    if not wanted:
        return [p for p in plans if not p.inherits]
    found = [p for p in plans if _names(p) & wanted]
    answered = {name for p in found if not p.inherits for name in _names(p) & wanted}
    return [p for p in found if not p.inherits or not _names(p) & wanted <= answered]


def _names(plan: ModelPlan) -> set[str]:
    return {plan.module.lower(), plan.module.lower().partition(".")[0], plan.cls.lower(), plan.label.lower()}


class _Resolved(dict):
    """``path.resolve()``, once per path for one selection (a closure over a release's 180 plans asks thousands of
    times, each a ``realpath`` of every component)."""

    def __call__(self, path: Path) -> Path:
        found = self.get(path)
        if found is None:
            found = self[path] = path.resolve()
        return found


def _closure(
    chosen: Sequence[ModelPlan], plans: Sequence[ModelPlan], whole_files: bool, resolve: Callable[[Path], Path]
) -> list[ModelPlan]:
    """``chosen`` plus every plan sharing a site (or a file) with one in it, to a fixpoint; in plan order."""

    def shared(plan: ModelPlan) -> dict[Any, str]:
        if whole_files:
            return {resolve(path): path.name for path in plan.files}
        # A shared forward is named first: it is what crashes without its __init__ edit.
        sites = sorted(plan.sites, key=lambda site: site.kind != EditKind.FORWARD)
        return {site.key: f"{site.cls}.{site.method}" for site in sites}

    why: dict[str, str | None] = {plan.label: None for plan in chosen}
    owners: dict[Any, ModelPlan] = {}
    for plan in chosen:
        for item in shared(plan):
            owners.setdefault(item, plan)
    grown = True
    while grown:
        grown = False
        for plan in plans:
            if plan.label in why:
                continue
            items = shared(plan)
            hit = next((item for item in items if item in owners), None)
            if hit is None:
                continue
            why[plan.label] = f"shares {items[hit]} with {owners[hit].label}"
            for item in items:
                owners.setdefault(item, plan)
            grown = True
    return [
        replace(plan, included_by=why[plan.label]) if why[plan.label] else plan for plan in plans if plan.label in why
    ]


def _touching(plans: Sequence[ModelPlan], files: set[Path]) -> list[ModelPlan]:
    """The plans whose files meet ``files``, closed over the files they share.

    A file one chosen model edits is checked for every model that edits it:
    a run on qwen3.py also edits qwen2.py (Qwen2Model), so Qwen2ForCausalLM
    comes along, and no file is left half patched (the pre-commit hooks
    then pass on the very next run).
    """
    files = set(files)
    chosen: set[int] = set()
    grown = True
    while grown:
        grown = False
        for index, plan in enumerate(plans):
            touched = {p.resolve() for p in plan.files} | {plan.path.resolve()}
            if index not in chosen and touched & files:
                chosen.add(index)
                files |= touched
                grown = True
    return [plan for index, plan in enumerate(plans) if index in chosen]
