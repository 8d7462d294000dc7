"""The hidden states a vLLM target feeds an EAGLE-3 draft: run the release's own setter and forward.

The shared machinery does the work (:mod:`patchcraft.harness.assemble`
compiles the release's methods from its files at their own lines into
stand-in classes, :mod:`patchcraft.harness.standins` gives the embedding,
layers and norm, :mod:`patchcraft.harness.served` names what reached the
draft); this module knows vLLM's class shapes:

- the model class holds its setter ``set_aux_hidden_state_layers`` (its own,
  or ``SupportsEagle3``'s from 0.18, which hands the ids to the inner
  model's ``EagleModelMixin._set_aux_hidden_state_layers``) and the getter
  of the defaults the runner calls (``get_eagle3_aux_hidden_state_layers``,
  later ``get_eagle3_default_aux_hidden_state_layers``);
- the inner model is ``self.model``; its ``forward`` captures at the top of
  each layer (``hidden_states + residual``) or, with the mixin, after each
  layer (``_maybe_add_hidden_state(aux, idx + 1, ...)``);
- a name that a vLLM file defines or imports from a sibling model file is
  the stand-in of that class (``isinstance(holder, EagleModelMixin)`` must
  hold), and a ``vllm.*`` import inside a method is a stand-in module
  (:mod:`patchcraft.harness.vllm_standins`).

vLLM's id X is ``hs[X]`` wherever the release captures it; which ids are
served, copied, aliased, dropped or collapsed is what running shows.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.tree_version import VersionLabel, identify
from patchcraft.harness import attention_residuals, hyper_connections
from patchcraft.harness.assemble import Program, Sources
from patchcraft.harness.extract import PATCHED, MethodCode, ModelSource
from patchcraft.harness.served import RunOutcome
from patchcraft.harness.shapes import ShapeError, embedding_attributes, layer_call, layer_stacks
from patchcraft.harness.nothing import Nothing
from patchcraft.harness.standins import (
    HarnessError,
    RecordingEmbedding,
    StandInConfig,
    StandInLayer,
    StandInNorm,
    World,
    activate,
)
from patchcraft.harness.subject import HIDDEN, TOKENS, VOCAB, input_ids
from patchcraft.harness.vllm_naming import failed, located_in, name_captures
from patchcraft.harness.vllm_standins import HELPERS, method_builtins
from patchcraft.planning.vllm_plans import served_outside
from patchcraft.reading.class_graph import ClassNode, ModelGraph, classes_assigned_to
from patchcraft.reading.vllm_families import read_tables, served
from patchcraft.reading.vllm_graph import (
    DRAFTS,
    FAMILY_ROOT,
    PACKAGE,
    SETTER,
    VllmGraph,
    family_module,
    language_model,
)
from patchcraft.reading.vllm_runner import read_registry

INNER = "model"


class NotATarget(HarnessError):
    """The class has no ``set_aux_hidden_state_layers``: this release serves it no EAGLE-3 draft."""


class VllmProgram(Program):
    """A :class:`Program` over a vLLM models directory: sibling classes are stand-ins, helpers vLLM's."""

    ONE_RANK = True  # run_ids and default_ids run World(): one rank, first and last stage

    def globals_for(self, path: Path) -> dict[str, Any]:
        namespace = super().globals_for(path)
        if not isinstance(namespace.get("__builtins__"), dict):
            namespace["__builtins__"] = method_builtins()
            module = self._module(path)
            namespace["__name__"] = f"vllm.{module}" if module.startswith(FAMILY_ROOT) else f"{PACKAGE}.{module}"
        return namespace

    def _module(self, path: Path) -> str:
        graph = self.graph
        return graph.module_of(path) if isinstance(graph, VllmGraph) else path.stem

    def _resolve(self, name: str, source: ModelSource) -> Any:
        node = self.graph.resolve(self._module(source.path), name)
        if node is not None:
            return self.stand_in(node)
        relative = name not in source.imports and name not in source.defined and name in _relative_imports(source)
        if name in HELPERS and (name in source.imports or name in source.defined or relative):
            return HELPERS[name]()
        if relative:  # `from .layernorm import beam_rms_norm`: a sibling module's helper is a stand-in, as any helper
            return Nothing(name)  # (unresolved, it raised NameError: a crash of the harness's, not the release's)
        return super()._resolve(name, source)


def _relative_imports(source: ModelSource) -> set[str]:
    """The names ``from .module import name`` binds at the top level of ``source`` (a family module's siblings)."""
    return {
        alias.asname or alias.name
        for stmt in source.syntax.body
        if isinstance(stmt, ast.ImportFrom) and stmt.level > 0
        for alias in stmt.names
    }


@dataclass(frozen=True)
class VllmModel:
    """A vLLM model class, its inner model and the layer convention its forward uses."""

    graph: ModelGraph
    outer: ClassNode
    inner: ClassNode
    forward_owner: ClassNode
    program: VllmProgram
    #: A multimodal wrapper the ids go through to this language model: ``kimi_k25.py:394
    #: KimiK25ForConditionalGeneration`` ("" when the class is the language model itself).
    via: str = ""
    #: The wrapper's language model, no EAGLE-3 target of its own, holding ``inner`` as its ``self.model``: the
    #: wrapper (``outer``) is run, its setter reaching ``self.language_model.model`` (0.27's CUDA Kimi-K3).
    language_model: Optional[ClassNode] = None
    #: The platform whose module this is (``find_model``'s ``platform``), None when none was named.
    platform: Optional[str] = None

    @property
    def label(self) -> str:
        return self.outer.label

    @property
    def files(self) -> set[str]:
        held = self.graph.mro(self.language_model) if self.language_model is not None else []
        return {str(c.path) for c in self.graph.mro(self.outer) + self.graph.mro(self.inner) + held}


@dataclass(frozen=True)
class VllmRun:
    """One setter call and one forward: the ids the model got and what reached the draft."""

    ids: Optional[tuple[int, ...]]  # what the setter was given
    outcome: RunOutcome
    #: For an entry that aliases the embedding: the state it holds after the forward (``hs[k]``), by position.
    aliased_holds: tuple[tuple[int, str], ...] = ()


def find_model(
    package: Path, name: str, texts: Optional[Mapping[Path, str]] = None, platform: Optional[str] = None
) -> VllmModel:
    """The class of ``name``: an architecture of vLLM's registry (a config's ``architectures``:
    ``MistralForCausalLM`` is ``llama.LlamaForCausalLM`` on 0.9), a class (``DeepseekV3ForCausalLM``, or the
    label ``deepseek_v2.DeepseekV3ForCausalLM``), or a file stem's EAGLE-3 class (``llama``); one line if none.

    A class without ``set_aux_hidden_state_layers`` in its MRO is no EAGLE-3 target on this release
    (:class:`NotATarget`); one whose inner model the harness cannot tell is a :class:`HarnessError`
    (a multimodal wrapper whose language model comes from vLLM's registry, e.g. Kimi-K2.5's). The
    caller reports both; neither is a usage error. ``texts``: file texts run instead of the files on disk
    (what ``apply`` would write). ``platform`` (``cuda``, ``rocm``, ``xpu``, ``cpu``): for an architecture a
    ``vllm/models/<family>/`` package serves, the class that platform's dispatch picks.
    """
    models = package / "model_executor" / "models"
    graph = VllmGraph(models)
    family = _family_row(graph, package, name) if name.count(".") > 1 else None
    if family is None and platform is not None and "." not in name:
        chosen = _on_platform(package, name, platform)
        if isinstance(chosen, str):
            name = chosen  # model_executor's stem.Class
        elif chosen is not None:
            family = chosen
    if family is not None:
        # a row's own module runs as its platform runs it (deepseek_v4.cpu's: unfused mHC streams)
        platform = platform or (family.platforms[0] if family.platforms else None)
        return replace(_family_model(graph, package, family, texts, platform), platform=platform)
    outer = _outer(graph, package, name)
    if graph.find_method(outer, SETTER) is None:
        raise NotATarget(f"{outer.label} has no {SETTER}: not an EAGLE-3 target on this release")
    inners = classes_assigned_to(graph, outer, INNER)
    if not inners:
        named = language_model(graph, outer)
        if named is not None and named[0] != outer.name:
            architecture, where = named
            found = find_model(package, architecture, texts)
            return replace(found, via=f"{where} {outer.name}")
        raise HarnessError(
            f"cannot tell which class `self.{INNER}` of {outer.label} is (a language model built from vLLM's "
            "registry from its config: name that class with --model)"
        )
    inner = inners[0]
    owner = next((c for c in graph.mro(inner) if "forward" in c.methods), None)
    if owner is None:
        raise HarnessError(f"{inner.label} has no forward")
    return VllmModel(
        graph, outer, inner, owner, VllmProgram(graph, Sources(package, texts), PATCHED), platform=platform
    )


def _family_row(graph: VllmGraph, package: Path, label: str) -> Optional[Any]:
    """The plan of a ``vllm/models/<family>/`` row (``deepseek_v32.nvidia.DeepseekV32ForCausalLM``), or None."""
    from patchcraft.base.vllm_tree import VllmTree
    from patchcraft.planning.vllm_plans import plan_vllm

    tree = VllmTree(package=package, root=package.parent)
    plan = next((p for p in plan_vllm(tree) if p.label == label), None)
    if plan is not None and not plan.platforms and plan.not_applicable and plan.unsupported:
        raise NotATarget(f"{label}: {plan.unsupported}")  # 0.25's deepseek_v4.amd: its platform's answer
    return plan if plan is not None and plan.platforms else None


def _on_platform(package: Path, architecture: str, platform: str) -> Any:
    """What ``platform`` serves for a family's ``architecture``: a ``stem.Class`` label of ``model_executor/models``,
    the family row (a plan), or None when no family serves it; one line when the platform is refused."""
    from patchcraft.base.vllm_tree import VllmTree
    from patchcraft.planning.vllm_plans import plan_vllm

    tables = read_tables(package)
    if not served_outside(tables, architecture):
        return None
    module, cls = tables[architecture]
    found = next((s for s in served(package, architecture, module, cls) if s.platform == platform), None)
    if found is None or found.refused:
        why = found.refused if found is not None else "not read"
        raise PatchcraftError(f"{architecture}: {_engine(package)} does not serve it on {platform}: {why}")
    if found.in_models:
        return f"{found.stem}.{found.cls}"
    tree = VllmTree(package=package, root=package.parent)
    for plan in plan_vllm(tree):
        if plan.path == found.path and plan.cls == found.cls and platform in plan.platforms:
            return plan
    raise NotATarget(  # one platform's answer (explain says it for that platform), not a usage error
        f"{architecture}: {found.file}'s {found.cls}, which {platform} serves, has no {SETTER}: not an EAGLE-3 "
        f"target on {platform}"
    )


def _family_model(
    graph: VllmGraph, package: Path, plan: Any, texts: Optional[Mapping[Path, str]], platform: Optional[str] = None
) -> VllmModel:
    """A family class on ``platform`` (else the first of its row's platforms): its own ``self.model``'s forward, run
    from its file; a wrapper naming its language model's architecture (Kimi-K3's ``KimiLinearForCausalLM``) runs
    the class that platform's dispatch builds for it, as Kimi-K2.5 runs its language model."""
    module = graph.module_of(plan.path)
    outer = graph.classes.get((module, plan.cls)) if graph.load(module) else None
    if outer is None:
        raise PatchcraftError(f"{plan.label}: no class {plan.cls} in {plan.path}")
    if graph.find_method(outer, SETTER) is None:
        raise NotATarget(f"{plan.label} has no {SETTER}: not an EAGLE-3 target on {', '.join(plan.platforms)}")
    inners = classes_assigned_to(graph, outer, INNER)
    if not inners:
        return _through_language_model(graph, package, plan, outer, texts, platform or plan.platforms[0])
    owner = next((c for c in graph.mro(inners[0]) if "forward" in c.methods), None)
    if owner is None:
        raise HarnessError(f"{inners[0].label} has no forward")
    return VllmModel(graph, outer, inners[0], owner, VllmProgram(graph, Sources(package, texts), PATCHED))


def _through_language_model(
    graph: VllmGraph,
    package: Path,
    plan: Any,
    outer: ClassNode,
    texts: Optional[Mapping[Path, str]],
    platform: str,
) -> VllmModel:
    """A family wrapper's language model, named by its architecture in its code, as ``platform`` builds it; one
    line when that class is no EAGLE-3 target of its own (0.33's XPU ``KimiLinearForCausalLM``, ``amd/linear.py``:
    the wrapper's setter reaches its inner model, which the harness does not assemble under a wrapper)."""
    named = language_model(graph, outer)
    if named is None or named[0] == outer.name:
        raise HarnessError(
            f"{plan.label} builds its language model through its platform's dispatch from the config's "
            "architectures: the harness runs a family class with its own `self.model`, or a language model its "
            "code names, only"
        )
    architecture, where = named
    try:
        chosen = _on_platform(package, architecture, platform)
        if isinstance(chosen, str) or chosen is None:
            found = find_model(package, chosen or architecture, texts)
        else:
            found = _family_model(graph, package, chosen, texts, platform)
    except (NotATarget, PatchcraftError) as exc:
        held = _held_language_model(graph, package, architecture, platform)
        if held is None:
            raise HarnessError(
                f"{plan.label} on {platform} builds its language model {architecture} ({where}), which the harness "
                f"cannot run as a target of its own: {exc}"
            ) from exc
        lm, inner, owner = held  # no setter of its own: the wrapper's setter reaches its `self.model`
        program = VllmProgram(graph, Sources(package, texts), PATCHED)
        return VllmModel(graph, outer, inner, owner, program, via="", language_model=lm)
    return replace(found, via=f"{where} {outer.name}")


def _held_language_model(
    graph: VllmGraph, package: Path, architecture: str, platform: str
) -> Optional[tuple[ClassNode, ClassNode, ClassNode]]:
    """The class ``platform`` serves for ``architecture`` from a family, its ``self.model`` class and that class's
    forward owner, when the class holds the mixin's model without a setter of its own; else None."""
    tables = read_tables(package)
    if architecture not in tables or not served_outside(tables, architecture):
        return None
    module, cls = tables[architecture]
    found = next((s for s in served(package, architecture, module, cls) if s.platform == platform), None)
    if found is None or found.refused or found.in_models or not found.module:
        return None
    stem = family_module(found.module)
    lm = graph.classes.get((stem, found.cls)) if graph.load(stem) else None
    inners = classes_assigned_to(graph, lm, INNER) if lm is not None else []
    if lm is None or not inners or graph.find_method(lm, SETTER) is not None:
        return None
    owner = next((c for c in graph.mro(inners[0]) if "forward" in c.methods), None)
    return (lm, inners[0], owner) if owner is not None else None


def eagle3_classes(package: Path) -> list[str]:
    """Every model class of the release with ``set_aux_hidden_state_layers`` in its MRO: labels (``file.Class``).

    Wrappers whose language model comes from vLLM's registry are listed too (the harness reports them
    as not run); drafts that inherit the setter (``Eagle3LlamaForCausalLM``, DFLASH, DSpark, MTP) are not.
    """
    models = package / "model_executor" / "models"
    graph = VllmGraph(models)
    for path in sorted(models.glob("*.py")):
        try:
            graph.load(path.stem)
        except PatchcraftError:  # a file that does not parse serves nothing
            continue
    return [
        node.label
        for node in sorted(graph.classes.values(), key=lambda c: c.label)
        if node.name.endswith(("ForCausalLM", "ForConditionalGeneration"))
        and not DRAFTS.search(node.name)
        and graph.find_method(node, SETTER)
    ]


def _outer(graph: ModelGraph, package: Path, name: str) -> ClassNode:
    models = graph.models_dir
    registered = read_registry(package)
    if name.count(".") > 1:  # a row of a vllm/models/<family>/ class (kimi_k3.nvidia.KimiLinearForCausalLM)
        raise PatchcraftError(f"{name}: {_engine(package)} {NOT_RUN}")
    if "." in name:  # a label, file.Class: the class of that file (a name some files share)
        stem, _, cls = name.partition(".")
        found = _in_file(graph, stem, cls)
        if found is None:  # a family architecture labelled by its family (deepseek_v32.DeepseekV32ForCausalLM)
            fallback = _refuse_family(package, registered, name, cls, stem)
            found = _in_file(graph, *fallback) if fallback else None
    elif name in registered:  # an architecture of a config.json
        fallback = _refuse_family(package, registered, name, name)
        found = _in_file(graph, *(fallback or registered[name]))
    elif served_outside(
        tables := read_tables(package), name
    ):  # the multimodal table's (KimiK3ForConditionalGeneration)
        fallback = _refuse_family(package, tables, name, name)
        found = _in_file(graph, *fallback) if fallback else None
    else:
        return _class_named(graph, models, name) if name[:1].isupper() else _class_of_stem(graph, models, name)
    if found is None:
        raise PatchcraftError(f"{name}: no such model class in {models}")
    return found


#: What a name served from ``vllm/models/<family>/`` needs where no one class answers for every platform.
NOT_RUN_WHY = (
    "each platform running its own module: name one with --platform (explain answers for each without it), or a "
    "row's label (`patchcraft apply --engine vllm --check` names each platform's class and says what it captures)"
)
NOT_RUN = f"serves it from vllm/models/, {NOT_RUN_WHY}"


def _engine(package: Path) -> str:
    version = str(VersionLabel(identify(package)))
    return "this vLLM tree" if version.startswith("unknown") else f"vLLM {version}"


def _refuse_family(
    package: Path, registered: dict[str, tuple[str, str]], name: str, architecture: str, stem: str = ""
) -> Optional[tuple[str, str]]:
    """An architecture vLLM serves from ``vllm/models/<family>/`` (0.22+): the ``model_executor/models`` class
    the family falls back to on some platforms (0.32's ``GlmMoeDsaForCausalLM`` on XPU and CPU is
    ``deepseek_v2.GlmMoeDsaForCausalLM``), run as what those platforms serve; with none, one line: the
    platforms' own modules are not run here."""
    where = served_outside(registered, architecture)
    if where is None or (stem and not where.endswith("/" + stem)):
        return None
    module, cls = registered[architecture]
    found = served(package, architecture, module, cls)
    fallback = sorted({(s.stem, s.cls) for s in found if s.in_models})
    if len(fallback) == 1:
        return fallback[0]
    platforms = "; ".join(f"{s.platform}: {s.refused or s.file or s.module}" for s in found)
    raise PatchcraftError(
        f"{name}: {_engine(package)} serves {architecture} from {where}/ ({platforms}), {NOT_RUN_WHY}"
    )


def _in_file(graph: ModelGraph, stem: str, cls: str) -> Optional[ClassNode]:
    return graph.classes.get((stem, cls)) if graph.load(stem) else None


def _class_named(graph: ModelGraph, models: Path, name: str) -> ClassNode:
    needle = f"class {name}(".encode()
    for path in sorted(models.glob("*.py")):
        try:
            found = needle in path.read_bytes()
        except OSError:
            continue
        if found and graph.load(path.stem) and (path.stem, name) in graph.classes:
            return graph.classes[(path.stem, name)]
    raise PatchcraftError(f"{name}: no such model class in {models}")


def _class_of_stem(graph: ModelGraph, models: Path, stem: str) -> ClassNode:
    if not graph.load(stem):
        raise PatchcraftError(f"{stem}: no model file {models / (stem + '.py')}")
    candidates = [c for (module, _), c in graph.classes.items() if module == stem and c.name.endswith("ForCausalLM")]
    with_setter = [c for c in candidates if graph.find_method(c, SETTER) is not None]
    chosen = with_setter or candidates
    if not chosen:
        raise PatchcraftError(f"{stem}.py: no ...ForCausalLM class; name the class with --model")
    return chosen[0]


def default_ids(model: VllmModel, getter: str, num_layers: int) -> tuple[tuple[int, ...], str]:
    """What the model's default getter returns (the runner calls ``getter``); ``((), why)`` when it cannot run."""
    try:
        with torch.no_grad(), activate(World()):
            outer = _build(model, num_layers)[0]
            return tuple(getattr(outer, getter)()), ""
    except Exception as exc:
        return (), f"{getter}: {located_in(exc, model.files)}"


def run_ids(model: VllmModel, ids: Sequence[int], num_layers: int) -> VllmRun:
    """``set_aux_hidden_state_layers(tuple(ids))`` then one forward, on ``num_layers`` stand-in layers."""
    chosen = tuple(ids)
    with torch.no_grad(), activate(World()):
        try:
            outer, inner, embedding, layers = _build(model, num_layers)
        except (HarnessError, ShapeError) as exc:
            return VllmRun(chosen, RunOutcome(not_run=f"not run: {exc}"))
        try:
            getattr(outer, SETTER)(chosen)
        except Exception as exc:
            return VllmRun(chosen, failed(exc, model.files, "setter"))
        try:
            result = _forward(model, inner)
        except HarnessError as exc:
            return VllmRun(chosen, RunOutcome(not_run=f"not run: {exc}"))
        except Exception as exc:
            return VllmRun(chosen, failed(exc, model.files, "forward"))
    if not any(getattr(layer, "_patchcraft_called", False) for layer in layers):  # it looped over other layers
        why = f"{model.forward_owner.label}.forward called no decoder layer of the harness's"
        return VllmRun(chosen, RunOutcome(not_run=f"not run: {why} (the layers it runs are not `self.layers`)"))
    aux = list(result[1]) if isinstance(result, tuple) and len(result) == 2 else []
    fed, holds = name_captures(aux, embedding, num_layers)
    return VllmRun(chosen, RunOutcome(fed=fed), holds)


def _build(model: VllmModel, num_layers: int) -> tuple[Any, Any, RecordingEmbedding, list[nn.Module]]:
    program = model.program
    forward = program.method(model.forward_owner, "forward")
    assert forward is not None
    init = next((c.methods["__init__"] for c in model.graph.mro(model.inner) if "__init__" in c.methods), None)
    call = layer_call(forward, layer_stacks(init))
    inner: Any = program.stand_in(model.inner)()
    embedding = RecordingEmbedding(VOCAB, HIDDEN, torch.Generator().manual_seed(0))
    for name in {"embed_tokens"} | _embedders(model, forward):
        inner.equip(name, embedding)
    config: StandInConfig
    if hyper_connections.has_streams(model.graph, model.inner, call):  # DeepSeek-V4's and GLM-5-Next's streams
        fused = hyper_connections.defers(forward.text, model.platform)
        layers: list[nn.Module] = [hyper_connections.StreamsLayer(i, call, fused) for i in range(num_layers)]
        config = hyper_connections.StreamsConfig(num_layers, HIDDEN, VOCAB)
        for name in hyper_connections.stream_attributes(model.graph, model.inner):
            inner.equip(name, hyper_connections.STREAMS)
        inner.equip("hc_head_op", hyper_connections.head)  # CPU, ROCm, XPU: ``self.hc_head_op = HCHeadOp()``
        for name in hyper_connections.post_op_attributes(model.graph, model.inner):  # GLM-5-Next's `_aux_post_op`
            inner.equip(name, hyper_connections.post)
    else:
        layers = [StandInLayer(i, call) for i in range(num_layers)]
        config = StandInConfig(num_layers, HIDDEN, VOCAB)
    for layer in layers:  # a pre-hook, not a counter in forward: the SGLang harness compiles the same layers
        layer.register_forward_pre_hook(_mark_called)
    stack = nn.ModuleList(layers)
    for name in layer_stacks(init):  # `layers`, and GLM-5-Next's `_active_layers` (a slice of it: all of it here)
        inner.equip(name, stack)
    inner.equip("start_layer", 0)
    inner.equip("end_layer", num_layers)
    inner.equip("norm", VllmNorm())
    inner.equip("config", config)
    inner.equip("hidden_size", HIDDEN)
    if attention_residuals.reads_switch(model.graph, model.inner):  # Kimi-K3: the residual-stream side, said
        setattr(config, attention_residuals.FIELD, None)
        for name, value in attention_residuals.derived(model.graph, model.inner, config, 0, num_layers).items():
            inner.equip(name, value)
    outer: Any = program.stand_in(model.outer)()
    outer.equip("config", config)
    if model.language_model is not None:  # the wrapper's setter reaches `self.language_model.model`
        held: Any = program.stand_in(model.language_model)()
        setattr(held, INNER, inner)
        setattr(outer, "language_model", held)
        # What vLLM's get_language_model() finds, the module `_mark_language_model` recorded in __init__ (its
        # helpers, module functions of interfaces.py, are not the harness's to run).
        outer.get_language_model = lambda: held
    else:
        setattr(outer, INNER, inner)
    return outer, inner, embedding, layers


def _mark_called(module: nn.Module, args: Any) -> None:
    """A forward pre-hook: the layer ran (the run reads the mark, never a counter the compiler would specialise on)."""
    object.__setattr__(module, "_patchcraft_called", True)


class VllmNorm(StandInNorm):
    """The final norm with vLLM's ``RMSNorm`` parameters, which a forward may hand to a kernel of its own after the
    loop (Beam's ``beam_rms_norm(hidden_states, self.norm.weight, ...)``): a stand-in's missing attribute is not a
    crash of the release's."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN), requires_grad=False)
        self.variance_epsilon = 1e-6


def _embedders(model: VllmModel, forward: MethodCode) -> set[str]:
    """The attributes the inner model embeds tokens with: ``self.A(input_ids)`` in its forward, or in a
    method of its own the forward calls so (GPT-OSS's ``self.embed_input_ids(input_ids)``, which calls
    ``self.embedding(input_ids)``). ``equip`` sets only those its ``__init__`` assigns."""
    found = set()
    for name in embedding_attributes(forward):
        method = model.graph.find_method(model.inner, name)
        code = model.program.method(method[0], name) if method is not None else None
        found |= embedding_attributes(code) if code is not None else {name}
    return found


def _forward(model: VllmModel, inner: Any) -> Any:
    function: Any = getattr(model.program.stand_in(model.forward_owner), "forward")
    inputs = {
        "input_ids": input_ids(),
        "positions": torch.arange(TOKENS),
        "intermediate_tensors": None,
        "inputs_embeds": None,
    }
    signature = inspect.signature(function)
    arguments = {}
    for name, parameter in list(signature.parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in inputs:
            arguments[name] = inputs[name]
        elif parameter.default is parameter.empty:
            raise HarnessError(f"{model.forward_owner.label}.forward takes `{name}`, which the harness cannot give")
    return function(inner, **arguments)
