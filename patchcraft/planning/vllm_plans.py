"""Which vLLM model classes need the embedding capture, and where it goes (docs/vllm.md).

vLLM's id X is ``hs[X]``. Every EAGLE-3 target (a ``...ForCausalLM`` or
``...ForConditionalGeneration`` class with ``set_aux_hidden_state_layers``
in its MRO, drafts aside) hands the ids to its inner model ``self.model``
(or, for a wrapper naming its language model's architecture in its code,
Kimi-K2.5's, to that model's). What the inner model's ``forward`` does
with id 0 decides the row:

- its layer loop captures ``hidden_states + residual`` at the top of layer
  ``idx`` (DeepSeek's ``DeepseekV2Model.forward``): id 0 raises, as
  ``residual`` is None there. One site, ``vllm-forward``, the transform
  ``vllm_capture_embedding``;
- it captures through ``EagleModelMixin._maybe_add_hidden_state`` (Llama,
  Qwen and most others from 0.18; the forward calls it, or reaches it
  through ``super().forward`` or a layer stack it calls): id 0 appends the
  embedding tensor itself, which layer 0 takes as its residual and its
  fused add-norm overwrites in place. One site for every such model, the
  mixin's method (``vllm-mixin``, the transform
  ``vllm_copy_mixin_embedding``): the rows say ``via interfaces.py
  EagleModelMixin``; where the tree has no such method the planner can
  read, unsupported, said so;
- it captures id 0 before its layer loop by appending the embedding tensor
  itself (Kimi-Linear's ``vllm/models/kimi_k3/nvidia/model.py``, 0.27-0.32's
  Cohere2-MoE): ``vllm-before-loop``, the transform
  ``vllm_copy_before_loop_capture``, a copy of that entry right after its
  append (planned again once there, so verify and revert find it);
- it captures only after each layer, the completed hyper-connection streams' mean (DeepSeek-V4's
  ``vllm/models/deepseek_v4/<platform>/model.py``: ``if idx + 1 in ...``), so id 0 captures nothing:
  ``vllm-add-capture``, the transform ``vllm_add_embedding_capture``, id 0's capture added before the loop
  (read by ``reading.vllm_captures.after_layer_loop``; planned again once there, so verify and revert find it);
- it captures nothing in a layer loop: not applicable, said in the row; where it returns the hidden
  states alone (MiMo), the row says EAGLE-3 itself cannot work with the class.

A class whose architecture vLLM's registry serves from ``vllm/models/<family>/``
(0.24+; not read here yet) is unsupported, said so, and every architecture
served from a family holding an EAGLE-3 target gets an unsupported row of
its own, after the others (docs/vllm.md).

The plans are :class:`~patchcraft.planning.records.ModelPlan`, as SGLang's,
so selection, the closure over shared sites and the engine take them
unchanged. ``ast`` only; the files read are those that can hold a target.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.memo import Memo, Stamp, stamp
from patchcraft.base.status import EditKind
from patchcraft.base.target import SglangTree
from patchcraft.planning.records import EditSite, ModelPlan
from patchcraft.planning.vllm_family_plans import Dispatch, fallback_notes, family_rows, named_architecture
from patchcraft.reading.class_graph import ClassNode, ModelGraph, classes_assigned_to
from patchcraft.reading.vllm_captures import (
    ALIAS,
    BEFORE,
    COPY,
    CRASH,
    DROPPED,
    added_capture,
    after_layer_loop,
    read_captures,
)
from patchcraft.reading.vllm_families import family_dispatch, read_tables
from patchcraft.reading.vllm_graph import DRAFTS, SETTER, VllmGraph, language_model
from patchcraft.reading.vllm_runner import read_registry

#: ``resolve(architecture)``: the class vLLM builds for an architecture its family dispatches (one platform's).
Resolver = Callable[[str], Optional[ClassNode]]

INNER = "model"
MIXIN = "EagleModelMixin"
MIXIN_CAPTURE = "_maybe_add_hidden_state"
#: Bytes a model file holding an EAGLE-3 target (or its inner model) contains; others are not parsed.
RELEVANT = (b"SupportsEagle3", SETTER.encode(), b"aux_hidden_state", b"language_model")


def plan_vllm(tree: SglangTree) -> list[ModelPlan]:
    """One plan per EAGLE-3 target class of the vLLM tree, in file and class order.

    Remembered for the process while no file it reads changes (the model files and ``vllm/models/``):
    a run plans, then judges the hand edits, on the same files.
    """
    files = sorted(tree.models_dir.glob("*.py"))

    def read() -> Stamp:
        """What planning reads: the model files (registry.py among them), vllm/models/ (0.24+), the version."""
        versions = [tree.package / name for name in ("version.py", "_version.py", "__init__.py")]
        return stamp(versions, folders=[(tree.models_dir, False), (tree.package / "models", True)])

    return list(_PLANNED.get(str(tree.models_dir.resolve()), read, lambda: _plan_all(tree, files)))


#: The plans of a tree, kept while no file they read changes (:mod:`patchcraft.base.memo`).
_PLANNED: Memo[list[ModelPlan]] = Memo(keep=1)


def _plan_all(tree: SglangTree, files: list[Path]) -> list[ModelPlan]:
    graph = VllmGraph(tree.models_dir)
    texts = {}
    for path in files:
        try:
            texts[path.stem] = path.read_bytes()
        except OSError:
            continue
    # The files that can hold a target, then those naming a target class of another file (0.34's
    # mistral_large_3.py subclasses DeepseekV3ForCausalLM), until no new file is read.
    words = set(RELEVANT)
    while True:
        wanted = [stem for stem, data in texts.items() if stem not in graph.loaded and any(w in data for w in words)]
        if not wanted:
            break
        for stem in wanted:
            try:
                graph.load(stem, texts[stem])
            except PatchcraftError:  # a file that does not parse serves nothing
                graph.loaded[stem] = False
        words |= {f"{node.name}".encode() for node in _targets(graph)}
    registry = read_registry(tree.package)
    version = str(tree.version)
    engine = "this vLLM tree" if version.startswith("unknown") else f"vLLM {version}"
    dispatch = Dispatch(tuple(family_dispatch(tree.package, read_tables(tree.package))))

    def planner(graph: VllmGraph, outer: ClassNode, resolve: Resolver) -> ModelPlan:
        return _plan(graph, registry, outer, resolve, family=True)

    plans = []
    for outer in _targets(graph):
        plan = _plan(graph, registry, outer, lambda name: _fallback(graph, dispatch, name))
        plans.append(named_architecture(dispatch, plan, engine) or fallback_notes(dispatch, plan, engine))
    labels = {plan.label for plan in plans}
    return plans + family_rows(graph, dispatch, engine, planner, labels)


def _fallback(graph: VllmGraph, dispatch: Dispatch, architecture: str) -> Optional[ClassNode]:
    """A language model architecture a family serves with one ``model_executor/models`` class on every
    platform it serves (0.32's ``DeepseekV32ForCausalLM`` on XPU and CPU is not that): that class."""
    found = {(s.stem, s.cls) for s in dispatch.of(architecture) if s.module}
    if len(found) != 1:
        return None
    stem, cls = found.pop()
    return graph.classes.get((stem, cls)) if stem and graph.load(stem) else None


def served_outside(registry: dict[str, tuple[str, str]], name: str) -> Optional[str]:
    """The folder (``vllm/models/deepseek_v32``) vLLM's registry serves architecture ``name`` from, when it
    lies outside ``model_executor/models`` (``vllm/models/<family>/``, from 0.22); None otherwise."""
    module = registry.get(name, ("", ""))[0]
    return module.replace(".", "/") if module.startswith("vllm.") else None


def _targets(graph: ModelGraph) -> list[ClassNode]:
    return [
        node
        for node in sorted(graph.classes.values(), key=lambda c: (c.module, c.name))
        if node.name.endswith(("ForCausalLM", "ForConditionalGeneration"))
        and not DRAFTS.search(node.name)
        and graph.find_method(node, SETTER)
    ]


def _plan(
    graph: ModelGraph,
    registry: dict[str, tuple[str, str]],
    outer: ClassNode,
    resolve: Resolver,
    family: bool = False,
) -> ModelPlan:
    """``family``: a class of ``vllm/models/`` (a capture override of its own gets no mixin edit)."""
    inner, via = _inner(graph, registry, outer, resolve)
    common: dict[str, Any] = dict(module=outer.module, cls=outer.name, path=outer.path)
    if inner is None:
        return ModelPlan(**common, unsupported=_unknown_language_model(graph, outer))
    owner = next((c for c in graph.mro(inner) if "forward" in c.methods), None)
    if owner is None:
        return ModelPlan(**common, unsupported=f"{inner.label} has no forward", not_applicable=True)
    forward = owner.methods["forward"]
    where = f"{owner.label}.forward ({owner.path.name}:{forward.lineno})"
    notes = (f"ids reach {inner.label} through {via}",) if via else ()
    if _reaches_mixin(graph, inner):
        return _mixin_plan(graph, inner, where, common, notes, family)
    handed, owner = owner, _past_super_forwards(graph, inner, owner)
    if owner is not handed:  # 0.15-0.17's MistralModel.forward: ``return super().forward(...)``
        forward = owner.methods["forward"]
        notes = (*notes, f"{where} hands its work to {owner.label}.forward (super().forward)")
        where = f"{owner.label}.forward ({owner.path.name}:{forward.lineno})"
    site = EditSite(kind=EditKind.VLLM_FORWARD, path=owner.path, module=owner.module, cls=owner.name, method="forward")
    top = _top_of_layer_capture(forward)
    if top and (not family or _top_of_layer_capture(forward, patched=True)):  # the edit's site (revert finds it)
        return ModelPlan(**common, sites=(site,), notes=notes)
    reading = read_captures(forward)
    first = reading.id0_capture
    if first is not None and first.place == BEFORE and (first.id0 == ALIAS or first.copied_next):
        # id 0 appended before the loop as the embedding tensor itself (Kimi-Linear): that entry made a copy
        site = replace(site, kind=EditKind.VLLM_BEFORE_LOOP)
        return ModelPlan(**common, sites=(site,), notes=notes)
    if after_layer_loop(forward) is not None and (reading.id0 == DROPPED or added_capture(forward)):
        # DeepSeek-V4: after each layer only (``idx + 1``), id 0 never captured: its capture added before the loop,
        # where the harness can run the class to prove it (else no edit: an overlay would refuse it unproven)
        if not _harness_reaches(graph, outer):
            return ModelPlan(
                **common,
                unsupported=f"{where} {reading.said(owner.path.name)}; its capture added before the loop "
                "(vllm-add-capture) would have to be proven on the harness, which runs a class holding its "
                f"`self.{INNER}` or a language model its code names, not one built as {via} (nothing unproven is "
                "written)",
                notes=notes,
            )
        site = replace(site, kind=EditKind.VLLM_ADD_CAPTURE)
        return ModelPlan(**common, sites=(site,), notes=notes)
    read_from: ast.AST = forward
    if not reading.captures:  # a forward handing its layer loop to a method of its own (0.33's DeepSeek-V4.1)
        for name in dict.fromkeys(_self_calls(forward)):
            helper = graph.find_method(inner, name)
            if helper is not None and name != "forward" and read_captures(helper[1]).captures:
                reading = read_captures(helper[1])
                read_from = helper[1]
                where = f"{where} through {helper[0].label}.{name} ({helper[0].path.name}:{helper[1].lineno}), which"
                break
    if not reading.captures:
        return ModelPlan(
            **common, not_applicable=True, unsupported=_captures_nothing(forward, where, owner), notes=notes
        )
    if reading.id0 == COPY:
        return ModelPlan(
            **common,
            not_applicable=True,
            unsupported=f"not needed: {where} {reading.said(owner.path.name)}",
            notes=notes,
        )
    if top and reading.id0 in (CRASH, ALIAS) and _threads_stream_and_residual(forward):
        return ModelPlan(**common, sites=(site,), notes=notes)  # a family's own top-of-layer capture (DeepSeek-V3.2)
    if top and reading.id0 in (CRASH, ALIAS):  # GLM-5-next's layers thread more state (post, comb): no proof
        return ModelPlan(
            **common,
            unsupported=f"{where} {reading.said(owner.path.name)}; its layer call threads more than the stream and the "
            "residual, which the harness cannot run, so no edit is offered unproven (an overlay would refuse it)",
            notes=notes,
        )
    threaded = _layer_call_targets(read_from)
    if top and len(threaded) > 2:  # GLM-5-Next's post/comb: the harness runs the mHC side only
        return ModelPlan(
            **common,
            unsupported=f"{where} {reading.said(owner.path.name)}; no edit for this capture yet: its layer call "
            f"(`{', '.join(threaded)} = ...`) threads hyper-connection state, and the harness runs its mHC layers "
            "only; an edit for id 0 would be for layers without hyper-connections (config.mhc false), which the "
            "harness does not run, and nothing unproven is written",
            notes=notes,
        )
    if read_from is not forward and reading.id0 == DROPPED:  # 0.33+'s ROCm DeepSeek-V4.1: through `_run_layers`
        return ModelPlan(
            **common,
            unsupported=f"{where} {reading.said(owner.path.name)}; no edit for this capture yet "
            "(vllm-add-capture adds id 0's capture to a forward whose own loop captures after each layer, not to a "
            "helper it calls)",
            notes=notes,
        )
    return ModelPlan(
        **common,
        unsupported=f"{where} {reading.said(owner.path.name)}; no edit for this capture yet",
        notes=notes,
    )


def _layer_call_targets(function: ast.AST) -> tuple[str, ...]:
    """The names a layer loop's call binds (``hidden_states, residual, post, comb = layer(...)``), or ()."""
    for loop in ast.walk(function):
        if not isinstance(loop, ast.For):
            continue
        for stmt in loop.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
                    return tuple(e.id for e in target.elts if isinstance(e, ast.Name))
    return ()


def _harness_reaches(graph: ModelGraph, outer: ClassNode) -> bool:
    """Whether the harness can run ``outer`` (``harness.vllm_served.find_model``): it holds its ``self.model``, or its
    code names its language model's architecture; a language model it constructs (0.30-0.32's ROCm DeepSeek-V4.1)
    is beyond it."""
    if classes_assigned_to(graph, outer, INNER):
        return True
    named = language_model(graph, outer)
    return named is not None and named[0] != outer.name


def _past_super_forwards(graph: ModelGraph, inner: ClassNode, owner: ClassNode) -> ClassNode:
    """The class whose forward does the work: past each forward of ``inner``'s MRO that captures nothing itself and
    calls ``super().forward`` (0.15-0.17's ``MistralModel``, whose layer loop is ``LlamaModel.forward``'s)."""
    mro = graph.mro(inner)
    while True:
        forward = owner.methods["forward"]
        if read_captures(forward).captures or _top_of_layer_capture(forward) or not _calls_super_forward(forward):
            return owner
        base = next((c for c in mro[mro.index(owner) + 1 :] if "forward" in c.methods), None)
        if base is None:
            return owner
        owner = base


def _captures_nothing(forward: ast.AST, where: str, owner: ClassNode) -> str:
    """Why a forward that captures nothing gets no edit. When it returns the hidden states alone, never the
    (hidden states, aux hidden states) pair vLLM's runners unpack with EAGLE-3 on, EAGLE-3 itself cannot work with
    the class (MiMo's ``MiMoModel.forward``): said plainly, as SGLang's rows say it, not "not needed"."""
    alone = _returns_alone(forward)
    if alone is None:
        return f"not needed: {where} has no layer loop that captures aux hidden states"
    return (
        f"{where} has no layer loop that captures aux hidden states and returns `{alone.value.id}` alone "  # type: ignore[union-attr]
        f"({owner.path.name}:{alone.lineno}), never the (hidden states, aux hidden states) pair vLLM's runner "
        "unpacks with EAGLE-3 on: EAGLE-3 itself, not only id 0 (hs[0]), does not work with this class"
    )


def _returns_alone(forward: ast.AST) -> ast.Return | None:
    """The last ``return NAME`` of ``forward`` (nested functions aside) when none of its returns is a tuple."""
    returns: list[ast.Return] = []
    stack = list(ast.iter_child_nodes(forward))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return):
            returns.append(node)
        stack.extend(ast.iter_child_nodes(node))
    if not returns or any(isinstance(r.value, ast.Tuple) or r.value is None for r in returns):
        return None
    last = max(returns, key=lambda r: r.lineno)
    return last if isinstance(last.value, ast.Name) else None


#: Why a mixin model gets no edit when the mixin's capture cannot be found (said in its row).
NO_MIXIN_EDIT = (
    "id 0 is the embedding tensor itself, overwritten in place by layer 0's fused add-norm; "
    "no edit for EagleModelMixin yet"
)


def _mixin_plan(
    graph: ModelGraph,
    inner: ClassNode,
    where: str,
    common: dict[str, Any],
    notes: tuple[str, ...],
    family: bool = False,
) -> ModelPlan:
    """The one site of every model capturing through the mixin: the method that captures, where it is defined
    (past overrides that hand the capture to ``super()``, as 0.33's ROCm ``KimiLinearModel`` does)."""
    owners = [c for c in graph.mro(inner) if MIXIN_CAPTURE in c.methods]
    owner = next((c for c in owners if not _calls_super(c.methods[MIXIN_CAPTURE], MIXIN_CAPTURE)), None)
    if owner is None:
        return ModelPlan(**common, unsupported=f"{where} captures through {MIXIN}: {NO_MIXIN_EDIT}")
    if family and owner.name != MIXIN:
        return ModelPlan(
            **common,
            unsupported=f"{where} captures through {owner.label}.{MIXIN_CAPTURE}, its own; no edit is written in "
            "vllm/models/ until the harness runs its modules (nothing unproven is written)",
            notes=notes,
        )
    if owner is not owners[0]:
        notes = (*notes, f"{owners[0].label}.{MIXIN_CAPTURE} hands the capture to {owner.label}'s")
    site = EditSite(
        kind=EditKind.VLLM_MIXIN, path=owner.path, module=owner.module, cls=owner.name, method=MIXIN_CAPTURE
    )
    return ModelPlan(**common, sites=(site,), notes=notes)


def _calls_super(function: ast.AST, name: str) -> bool:
    """``super().NAME(...)`` in ``function``."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "super"
        for node in ast.walk(function)
    )


def _reaches_mixin(graph: ModelGraph, cls: ClassNode, depth: int = 2) -> bool:
    """Whether ``cls``'s forward calls the mixin's capture: itself, through ``super().forward`` (Mistral's
    ``MistralModel``), or through a module it builds in ``__init__`` and calls (0.34's PLaMo-3 layer stack)."""
    owners = [c for c in graph.mro(cls) if "forward" in c.methods]
    for owner in owners:
        forward = owner.methods["forward"]
        if _calls(forward, MIXIN_CAPTURE):
            return True
        if depth > 0:
            for name in _self_calls(forward):
                if any(_reaches_mixin(graph, c, depth - 1) for c in classes_assigned_to(graph, cls, name)):
                    return True
        if not _calls_super_forward(forward):
            return False
    return False


def _self_calls(function: ast.AST) -> list[str]:
    """``NAME`` of each ``self.NAME(...)`` call."""
    return [
        node.func.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ]


def _calls_super_forward(function: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "forward"
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "super"
        for node in ast.walk(function)
    )


def _inner(
    graph: ModelGraph, registry: dict[str, tuple[str, str]], outer: ClassNode, resolve: Resolver
) -> tuple[Optional[ClassNode], str]:
    """``self.model``'s class, or that of the language model a wrapper builds (and where it builds it): named by
    its architecture (``init_vllm_registered_model(..., architectures=["X"])``, Kimi-K2.5), or constructed
    (``self.language_model = Qwen3LLMForCausalLM(...)``, ``initialize_model(..., model_class=X)``)."""
    inners = classes_assigned_to(graph, outer, INNER)
    if inners:
        return inners[0], ""
    named = language_model(graph, outer)
    target: Optional[ClassNode] = None
    where = ""
    if named is not None:
        where = named[1]
        if named[0] in registry and not registry[named[0]][0].startswith("vllm."):
            stem, cls = registry[named[0]]
            target = graph.classes.get((stem, cls)) if graph.load(stem) else None
        else:  # served from a family package: the class this platform's dispatch builds
            target = resolve(named[0])
    else:
        target, where = _built_language_model(graph, outer)
    if target is None or target is outer:
        return None, ""
    inners = classes_assigned_to(graph, target, INNER)
    return (
        (inners[0], f"its language model {target.label} (`self.{LANGUAGE_MODEL}`, {where})") if inners else (None, "")
    )


LANGUAGE_MODEL = "language_model"
#: vLLM's helper that builds a model class from the config's architectures (which this reading cannot know).
REGISTERED = "init_vllm_registered_model"


def _built_language_model(graph: ModelGraph, outer: ClassNode) -> tuple[Optional[ClassNode], str]:
    """The class ``self.language_model`` is constructed from in an ``__init__`` of ``outer``'s MRO (the most derived
    one assigning it), and ``file:line``: a class called, or ``initialize_model(..., model_class=X)``."""
    for owner in graph.mro(outer):
        init = owner.methods.get("__init__")
        if init is None:
            continue
        assigns = _language_model_assigns(init)
        for node, call in assigns:
            named = next((k.value for k in call.keywords if k.arg == "model_class"), None)
            expr = named if named is not None else call.func
            name = ast.unparse(expr)
            found = graph.resolve(owner.module, name) if name != REGISTERED else None
            if found is not None:
                return found, f"{owner.path.name}:{node.lineno}"
        if assigns:
            return None, ""
    return None, ""


def _language_model_assigns(init: ast.AST) -> list[tuple[ast.stmt, ast.Call]]:
    """``self.language_model = CALL`` (or ``self.language_model: T = CALL``) in ``init``, in line order."""
    found: list[tuple[ast.stmt, ast.Call]] = []
    for node in ast.walk(init):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = getattr(node, "value", None)
        if isinstance(value, ast.Call) and any(
            isinstance(t, ast.Attribute) and t.attr == LANGUAGE_MODEL for t in targets
        ):
            found.append((node, value))  # type: ignore[arg-type]
    return sorted(found, key=lambda item: item[0].lineno)


def _unknown_language_model(graph: ModelGraph, outer: ClassNode) -> str:
    """Why the class of ``outer``'s language model cannot be told, in the words of the code that builds it."""
    for owner in graph.mro(outer):
        init = owner.methods.get("__init__")
        for node, call in _language_model_assigns(init) if init is not None else ():
            built = ast.unparse(call.func)
            if built == REGISTERED:
                return (
                    f"cannot tell which class `self.{LANGUAGE_MODEL}` of {outer.label} is: {REGISTERED} builds it "
                    f"from the config's architectures ({owner.path.name}:{node.lineno})"
                )
            return (
                f"cannot tell which class `self.{LANGUAGE_MODEL}` of {outer.label} is: it is built by {built}(...) "
                f"({owner.path.name}:{node.lineno}), which names no model class"
            )
    return (
        f"cannot tell which class `self.{INNER}` of {outer.label} is: no __init__ of its MRO assigns "
        f"`self.{INNER}` or `self.{LANGUAGE_MODEL}` a class this reading follows"
    )


def _calls(function: ast.AST, name: str) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
        for node in ast.walk(function)
    )


def _top_of_layer_capture(function: ast.AST, patched: bool = False) -> bool:
    """A ``for`` loop holding ``if <loop variable> in <ids>:`` whose body reads ``residual``: vLLM's
    top-of-layer capture (the transform checks the rest, and refuses what it cannot place)."""
    for loop in ast.walk(function):
        if not isinstance(loop, ast.For):
            continue
        names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        for stmt in loop.body:
            if not isinstance(stmt, ast.If):
                continue
            test: Optional[ast.expr] = stmt.test
            if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
                test = test.values[0]  # patched: ``... and residual is not None``
            elif patched:
                continue
            if (
                isinstance(test, ast.Compare)
                and isinstance(test.left, ast.Name)
                and test.left.id in names
                and isinstance(test.ops[0], ast.In)
                and any(isinstance(n, ast.Name) and n.id == "residual" for s in stmt.body for n in ast.walk(s))
            ):
                return True
    return False


def _threads_stream_and_residual(function: ast.AST) -> bool:
    """The layer loop rebinds exactly two names from a call (``hidden_states, residual = layer(...)``): the layer
    call the harness runs; GLM-5-next's ``hidden_states, residual, post, comb = layer(...)`` is not one."""
    for loop in ast.walk(function):
        if not isinstance(loop, ast.For):
            continue
        for stmt in loop.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
                    return len(target.elts) == 2
    return False


def is_vllm(tree: SglangTree) -> bool:
    """Whether the tree is vLLM's (``base.vllm_tree.VllmTree``)."""
    return tree.engine == "vllm"
