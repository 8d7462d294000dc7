"""Turn a model class graph into one :class:`ModelPlan` per model class.

A model class is a class that defines ``set_eagle3_layers_to_capture``,
or inherits it and builds a different inner model (``Llama4ForCausalLM``
inherits Llama's setter but its ``self.model`` is ``Llama4Model``, which
has its own ``forward``). Every such class gets a plan: its edit sites,
or the precise reason it cannot be supported. None is skipped silently.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.sources import decode
from patchcraft.reading.parsed import parse_python
from patchcraft.reading.class_graph import (
    SETTER,
    ClassNode,
    ModelGraph,
    assigns_self_attr,
    class_assigns,
    constructors_of,
    group_of,
    read_forward,
    nodes_of,
    words_of,
    read_setter,
    references_self_attr,
)
from patchcraft.planning.records import EditSite, ForwardParams, ModelPlan, SetterParams
from patchcraft.planning.runner_edits import setter_calls
from patchcraft.reading.fusion_reading import MarkParams, read_capture
from patchcraft.reading.prefilter import ModelTexts, read_models
from patchcraft.base.status import EditKind
from patchcraft.base.tree_version import tree_noun


#: Start of the reason given for an inner model's helper setter that nothing calls.
OWN_HELPER = "inner-model helper only:"
#: In the reason given for a class whose inner model captures nothing (a draft or NextN head).
NO_CAPTURE = "has no aux hidden-state capture at all"


def scan(models_dir: Path) -> ModelGraph:
    """Parse the model files that can matter (cheap text filters before any parse).

    First the files that mention the setter; then, until nothing new turns
    up, the files that mention a class having the setter (its own or
    inherited): a subclass may live in a file that names neither the
    setter nor ``layers_to_capture`` (qwen4_exp, qwen3_omni_moe, the EAGLE
    drafts), and it is a model class all the same. Inner models in other
    files are loaded when the graph resolves them.
    """
    graph = ModelGraph(models_dir=models_dir)
    texts = ModelTexts(read_models(models_dir))
    # ``m.K``, with ``K`` only imported by ``m``, resolves to a class of a third file,
    # whose name need not be ``K``: such files are loaded up front (a few, if any).
    pending = [stem for stem in texts.data if texts.has_setter(stem) or texts.may_derive_through_imports(stem)]
    searched: set[bytes] = set()
    while pending:
        for stem in pending:
            graph.load(stem, texts.data[stem])
        names = {c.name.encode() for c in list(graph.classes.values()) if graph.find_method(c, SETTER)} - searched
        searched |= names
        pending = (
            [stem for stem in texts.data if stem not in graph.loaded and texts.mentions_any(stem, names)]
            if names
            else []
        )
    return graph


def plan_models(graph: ModelGraph, inheriting: bool = False) -> list[ModelPlan]:
    """One plan per model class, in file then line order.

    ``inheriting`` adds a row for each entry class that inherits a model
    class's setter and needs no site of its own (``ModelPlan.inherits``),
    so that ``--model mellum`` or ``verify mellum.py`` can confirm it.
    """
    plans: dict[tuple[str, str], ModelPlan] = {}
    # An inner model's own setter (the "inner helper" variant) is called by the
    # outer model's setter; the inner model is not a model class of its own.
    owners = [
        c
        for c in list(graph.classes.values())
        if SETTER in c.methods and not class_assigns(graph, c, "layers_to_capture")
    ]
    candidates = list(owners)
    for owner in owners:
        for sub in graph.subclasses(owner):
            if sub not in candidates:
                candidates.append(sub)
    same_as_parent: list[ClassNode] = []
    for cls in candidates:
        plan = plan_model(graph, cls)
        if cls not in owners and not _differs_from_parent(graph, cls, plan, plans):
            same_as_parent.append(cls)
            continue
        plans[cls.key] = plan
    # A helper whose inner model another plan edits is that plan's business.
    edited = {(s.module, s.cls) for plan in plans.values() for s in plan.sites}
    for key, plan in list(plans.items()):
        if plan.unsupported and plan.unsupported.startswith(OWN_HELPER) and key in edited:
            del plans[key]
    plans = _with_inheriting_inits(graph, plans)
    rows = list(plans.values())
    if inheriting:
        rows += [row for cls in same_as_parent if (row := _inherited_row(graph, cls, plans)) is not None]
    return sorted(rows, key=lambda p: (p.module, _line(graph, p)))


def _inherited_row(graph: ModelGraph, cls: ClassNode, plans: dict[tuple[str, str], ModelPlan]) -> ModelPlan | None:
    """``cls``'s row when it is its file's entry class: its parent's plan, under its own name."""
    found = graph.find_method(cls, SETTER)
    parent = plans.get(found[0].key) if found else None
    if parent is None or not _is_entry_class(cls):
        return None
    return replace(parent, module=cls.module, cls=cls.name, path=cls.path, inherits=parent.label, included_by=None)


def _is_entry_class(cls: ClassNode) -> bool:
    """Whether ``cls``'s file names it in ``EntryClass``: the classes SGLang serves from that file."""
    try:
        tree = parse_python(decode(cls.path, cls.path.read_bytes()).text)
    except (OSError, SyntaxError, ValueError, PatchcraftError):
        return False
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
            return cls.name in {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
    return False


def _with_inheriting_inits(
    graph: ModelGraph, plans: dict[tuple[str, str], ModelPlan]
) -> dict[tuple[str, str], ModelPlan]:
    """Give every class that runs a patched ``forward`` the flag in its own ``__init__``.

    A class may inherit an inner model's capturing forward with an
    ``__init__`` of its own and be no model's inner model (0.5.8's
    ``MistralLarge3Model``, built through ``self.model_cls`` for the EAGLE
    draft): the patched forward then reads a flag that class never sets.
    Its ``__init__`` site joins every plan that patches that forward.
    """
    forwards: dict[tuple[str, str, str], list[EditSite]] = {}
    for cls in list(graph.classes.values()):
        found = _capturing_forward(graph, cls)
        init = _init_owner(graph, cls)
        if found is None or init is None:
            continue
        forward_key = (str(found[0].path), found[0].name, "forward")
        site = EditSite(kind=EditKind.INIT, path=init.path, module=init.module, cls=init.name, method="__init__")
        if site not in forwards.setdefault(forward_key, []):
            forwards[forward_key].append(site)
    result: dict[tuple[str, str], ModelPlan] = {}
    for key, plan in plans.items():
        # In file and class order: a single-file run loads classes in another order than the whole tree.
        extra = sorted(
            (i for s in plan.sites if s.kind == EditKind.FORWARD for i in forwards.get(s.key, ())),
            key=lambda i: (str(i.path), i.cls),
        )
        result[key] = replace(plan, sites=tuple(_unique([*plan.sites, *extra]))) if extra else plan
    return result


def _init_owner(graph: ModelGraph, cls: ClassNode) -> ClassNode | None:
    """The class whose ``__init__`` sets ``self.layers_to_capture`` for ``cls`` (where the flag goes)."""
    return next(
        (
            o
            for o in graph.mro(cls)
            if "__init__" in o.methods and assigns_self_attr(o.methods["__init__"], "layers_to_capture")
        ),
        None,
    )


def _line(graph: ModelGraph, plan: ModelPlan) -> int:
    cls = graph.classes.get((plan.module, plan.cls))
    return cls.node.lineno if cls else 0


def _differs_from_parent(graph: ModelGraph, cls: ClassNode, plan: ModelPlan, plans: dict) -> bool:
    """An inheriting class is its own model only when it needs other sites."""
    found = graph.find_method(cls, SETTER)
    if found is None:
        return False
    parent = plan_model(graph, found[0])
    return {s.key for s in plan.sites} != {s.key for s in parent.sites} or plan.unsupported != parent.unsupported


def plan_model(graph: ModelGraph, cls: ClassNode, _depth: int = 0) -> ModelPlan:
    """Find the three edit sites for model class ``cls``, or why there are none."""
    memo = graph.plans
    if (cls.key, _depth) not in memo:
        memo[(cls.key, _depth)] = _plan_model(graph, cls, _depth)
    return memo[(cls.key, _depth)]


def _legacy(graph: ModelGraph, where: str) -> str:
    """Why a setter without ids is unsupported: SGLang cannot pass ids, or (a fork) passes them and crashes.

    0.4.6's runner calls the setter without ids. A fork that grew its own
    EAGLE-3 runner on 0.4.x (SGLang-FluentLLM) passes ids to every target's
    setter, so with this one the server raises TypeError at start-up.
    """
    said = f"{where} takes no layer_ids parameter (legacy setter)"
    calls = [
        c
        for c in setter_calls(graph.models_dir.parent / "model_executor", strict=False)
        if c.has_ids and not c.marked and not _passes_none(c.node)
    ]
    if not calls:
        return f"{said}; ids cannot be passed, so -1 cannot be requested"
    return (
        f"{said}, but {calls[-1].where} passes ids to it: SGLang fails at start-up with this model "
        "as an EAGLE-3 target (TypeError: too many positional arguments), and -1 cannot be requested"
    )


def _passes_none(call: ast.Call) -> bool:
    values = list(call.args) + [k.value for k in call.keywords]
    return all(isinstance(v, ast.Constant) and v.value is None for v in values)


def _plan_model(graph: ModelGraph, cls: ClassNode, _depth: int) -> ModelPlan:
    base: dict[str, Any] = dict(module=cls.module, cls=cls.name, path=cls.path)
    key = (cls.module, cls.name)
    if key in graph.duplicates:
        return ModelPlan(
            **base,
            unsupported=f"class {cls.name} is defined {graph.duplicates[key]} times in {cls.path.name}; ambiguous anchor",
        )
    found = graph.find_method(cls, SETTER)
    assert found is not None
    setter_owner, setter = found
    shape = read_setter(setter)
    where = f"{setter_owner.path.name}: {setter_owner.name}.{SETTER}"
    if shape.variant == "legacy":
        return ModelPlan(**base, unsupported=_legacy(graph, where))
    if shape.delegate_attr is not None:
        return _plan_delegation(graph, cls, shape.delegate_attr, base, where, _depth)
    if shape.variant == "own-helper":
        return ModelPlan(
            **base,
            not_applicable=True,
            unsupported=(
                f"{OWN_HELPER} {where} sets its own layers_to_capture, and no model class in "
                "sglang/srt/models calls it (no outer setter): EAGLE-3 is not wired for this model at all"
            ),
        )
    if shape.inner_attr is None:
        return ModelPlan(
            **base,
            unsupported=f"{where} sets no `self.<model>.layers_to_capture` and calls no inner setter; nothing to extend",
        )
    inner_classes, unresolved = constructors_of(graph, cls, shape.inner_attr)
    if not inner_classes:
        return ModelPlan(**base, unsupported=_unresolved(cls, shape.inner_attr, unresolved, where))
    pp = _pipeline_group(graph, cls, setter, shape.inner_attr, inner_classes)
    sites: list[EditSite] = [
        EditSite(
            kind=EditKind.SETTER,
            path=setter_owner.path,
            module=setter_owner.module,
            cls=setter_owner.name,
            method=SETTER,
            params=SetterParams(target=f"self.{shape.inner_attr}", param=shape.param or "layer_ids", pp=pp),
        )
    ]
    notes = [f"setter: {shape.variant}"]
    for inner in inner_classes:
        problem = _inner_sites(graph, inner, sites, notes) or _unmarked(graph, inner, setter, shape.inner_attr, where)
        if problem:
            return ModelPlan(**base, unsupported=problem, notes=tuple(notes), not_applicable=NO_CAPTURE in problem)
    sites.extend(_fusion_mark(graph, cls))
    return ModelPlan(**base, sites=tuple(_unique(sites)), notes=tuple(notes))


def _fusion_mark(graph: ModelGraph, cls: ClassNode) -> list[EditSite]:
    """The setter's layer marks, where the capture reads a deferred all-reduce sum (fusion_reading)."""
    capture = read_capture(graph, cls)
    if capture is None or not capture.affected:
        return []
    params = MarkParams(target=capture.target, communicator=capture.communicator)
    module = capture.setter_path.stem
    return [
        EditSite(
            kind=EditKind.FUSION_MARK,
            path=capture.setter_path,
            module=module,
            cls=capture.setter_cls,
            method=SETTER,
            params=params,
        )
    ]


def _unmarked(graph: ModelGraph, inner: ClassNode, setter, attr: str, where: str) -> str | None:
    """Why nothing is captured when the forward only captures layers flagged ``_is_layer_to_capture``
    and neither the setter nor the inner helper it calls ever sets that flag (0.5.13-0.5.20
    Qwen3.5 under the Qwen3-VL setter): an embedding capture alone would feed the draft one
    state instead of k."""
    found = _capturing_forward(graph, inner)
    if found is None or not read_forward(found[1]).flag_gated_only:
        return None
    marks = "_is_layer_to_capture" in words_of(setter)
    helper = graph.find_method(inner, SETTER)
    if helper is not None and SETTER in words_of(setter):
        marks = marks or "_is_layer_to_capture" in words_of(helper[1])
    if marks:
        return None
    return (
        f"{where} assigns `self.{attr}.layers_to_capture`, but {found[0].label}.forward captures only "
        f"layers flagged `_is_layer_to_capture`, which {_flag_setters(graph, inner)}: no layer is captured "
        "at all (EAGLE-3 itself is broken here), and the embedding alone would feed the draft one state"
    )


#: Other capture paths' setters that may flag layers (``set_dflash_layers_to_capture``, 0.5.13 on).
_OTHER_SETTERS = ("set_dflash_layers_to_capture",)


def _flag_setters(graph: ModelGraph, inner: ClassNode) -> str:
    """Who sets ``_is_layer_to_capture``: exactly which path does (not EAGLE-3's), or that nothing does."""
    others = [
        f"{found[0].name}.{name}"
        for name in _OTHER_SETTERS
        if (found := graph.find_method(inner, name)) is not None and "_is_layer_to_capture" in words_of(found[1])
    ]
    if others:
        return f"only {', '.join(others)} (the DFLASH path) sets, never the EAGLE-3 setter"
    return f"nothing sets in {tree_noun(graph.models_dir.parent.parent)}"


def _pipeline_group(graph: ModelGraph, cls: ClassNode, setter, inner_attr: str, inners: list[ClassNode]) -> str:
    """The pipeline group whose ``world_size`` the setter block checks ("" when none exists).

    The setter's own guard names it (``get_pp_group()``, ``self.pp_group``);
    else the outer class's ``self.pp_group``; else the inner model's, when
    only the inner model knows its pipeline rank (Qwen2.5-VL in 0.5.2).
    """
    named = group_of(setter, "is_last_rank")
    if named:
        return named
    if class_assigns(graph, cls, "pp_group"):
        return "self.pp_group"
    if any(class_assigns(graph, inner, "pp_group") for inner in inners):
        return f"self.{inner_attr}.pp_group"
    return ""


def _unresolved(cls: ClassNode, attr: str, calls: list[str], where: str) -> str:
    if calls:
        return (
            f"{where} works on `self.{attr}`, built by {calls[0]}: a class chosen at run time, "
            "not one defined in sglang/srt/models, so its forward cannot be patched here"
        )
    return f"{cls.path.name}: {cls.name}.__init__ never builds `self.{attr}` (the inner model the setter configures)"


def _plan_delegation(
    graph: ModelGraph, cls: ClassNode, attr: str, base: dict[str, Any], where: str, depth: int
) -> ModelPlan:
    targets, unresolved = constructors_of(graph, cls, attr)
    if not targets:
        return ModelPlan(**base, unsupported=_unresolved(cls, attr, unresolved, where))
    sites: list[EditSite] = []
    names = []
    notes = ["setter: delegation"]
    for target in targets:
        if graph.find_method(target, SETTER) is None or depth > 4:
            return ModelPlan(**base, unsupported=f"{where} delegates to {target.label}, which has no {SETTER}")
        delegate = plan_model(graph, target, depth + 1)
        if delegate.unsupported:
            return ModelPlan(
                **base,
                unsupported=f"delegates to {target.label}: {delegate.unsupported}",
                delegate=target.label,
                not_applicable=delegate.not_applicable,
            )
        sites.extend(delegate.sites)
        names.append(target.label)
        notes.extend(n for n in delegate.notes if n not in notes)
    return ModelPlan(**base, sites=tuple(_unique(sites)), delegate=", ".join(names), notes=tuple(notes))


def _inner_sites(graph: ModelGraph, inner: ClassNode, sites: list[EditSite], notes: list[str]) -> str | None:
    """Append the init and forward sites of inner model ``inner``; or say why not."""
    init_owner = _init_owner(graph, inner)
    found = _capturing_forward(graph, inner)
    if init_owner is None and found is None:
        return (
            f"{inner.label} {NO_CAPTURE} (no `self.layers_to_capture` in __init__, "
            "no capture in forward): the setter has no effect on it, so EAGLE-3 itself, not only layer id -1, "
            "is unavailable for this class"
        )
    if init_owner is None:
        return f"{inner.label} (or its bases) never initialises `self.layers_to_capture` in __init__"
    if found is None:
        return f"{inner.label}: forward never captures aux hidden states (no layers_to_capture in it, nor in the super().forward it calls)"
    forward_owner, forward = found
    early = _returns_before_aux(forward)
    if early is not None:
        return (
            f"{forward_owner.label}.forward returns `{ast.unparse(early.value) if early.value else 'None'}` on every non-idle batch "
            f"(line {early.lineno}), before its aux states: none ever reaches the draft, so EAGLE-3 itself does not work "
            f"with this model in {tree_noun(graph.models_dir.parent.parent)}"
        )
    gate = group_of(forward, "is_first_rank")
    if gate:
        gate = f"{gate}.is_first_rank"
    elif class_assigns(graph, forward_owner, "pp_group"):
        gate = "self.pp_group.is_first_rank"
    elif class_assigns(graph, forward_owner, "start_layer"):
        gate = "self.start_layer == 0"
    sites.append(
        EditSite(
            kind=EditKind.INIT, path=init_owner.path, module=init_owner.module, cls=init_owner.name, method="__init__"
        )
    )
    params = ForwardParams(gate=gate or "", copies=collector_copies(graph.models_dir, read_forward(forward).collector))
    sites.append(
        EditSite(
            kind=EditKind.FORWARD,
            path=forward_owner.path,
            module=forward_owner.module,
            cls=forward_owner.name,
            method="forward",
            params=params,
        )
    )
    for label in read_forward(forward).labels():
        if f"forward: {label}" not in notes:
            notes.append(f"forward: {label}")
    return None


@functools.lru_cache(maxsize=32)
def collector_copies(models_dir: Path, collector: str) -> bool:
    """Whether the release's collector class ``collector`` copies what its ``append`` gets.

    ``AuxHiddenStatePacker.append`` (0.5.18 on) copies into its preallocated
    buffer (``....copy_(hidden)``), so the embedding capture need not clone
    first: that would copy twice. Read from ``srt/layers/aux_hidden_states.py``;
    anything unclear (no such file or class, another body) means "no", and
    the capture clones as usual.
    """
    path = models_dir.parent / "layers" / "aux_hidden_states.py"
    try:
        tree = parse_python(decode(path, path.read_bytes()).text)
    except (OSError, SyntaxError, ValueError, PatchcraftError):
        return False
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == collector:
            append = next((f for f in stmt.body if isinstance(f, ast.FunctionDef) and f.name == "append"), None)
            return append is not None and _copies_argument(append)
    return False


def _copies_argument(func: ast.FunctionDef) -> bool:
    """``something.copy_(<first argument>)`` in ``func``'s body."""
    if len(func.args.args) < 2:
        return False
    argument = func.args.args[1].arg
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "copy_"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == argument
        for node in ast.walk(func)
    )


def _returns_before_aux(func: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Return | None:
    """``if not <batch>.forward_mode.is_idle(): return <no aux>`` in the forward's own body.

    Qwen4-Exp (0.5.20+) returns ``(hidden_states, hc_hidden_states)`` there:
    its aux collector is returned on idle batches only, so capturing more
    (the embedding) changes nothing the draft sees.
    """
    for stmt in func.body:
        if not (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.UnaryOp) and isinstance(stmt.test.op, ast.Not)):
            continue
        call = stmt.test.operand
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "is_idle"):
            continue
        last = stmt.body[-1] if stmt.body else None
        if isinstance(last, ast.Return) and not any("aux" in word for word in words_of(last)):
            return last
    return None


def _captures(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(references_self_attr(func, a) for a in ("layers_to_capture", "capture_aux_hidden_states")) or (
        "_is_layer_to_capture" in words_of(func)
    )


def _capturing_forward(graph: ModelGraph, inner: ClassNode):
    """The ``forward`` that runs the capture loop, following ``super().forward(...)``.

    A subclass may wrap its parent's forward (an EAGLE draft feeding fused
    inputs to ``super().forward``); the capture, and so the edit, is then in
    the parent's forward.
    """
    for owner in graph.mro(inner):
        forward = owner.methods.get("forward")
        if forward is None:
            continue
        if _captures(forward):
            return owner, forward
        if not _calls_super_forward(forward):
            return None
    return None


def _calls_super_forward(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in nodes_of(func):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "forward"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            return True
    return False


def _unique(sites: Iterable[EditSite]) -> list[EditSite]:
    seen: dict[tuple, EditSite] = {}
    for site in sites:
        seen.setdefault(site.key, site)
    return list(seen.values())
