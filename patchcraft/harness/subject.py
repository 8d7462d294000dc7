"""One model class, ready to build from either variant of its files and to run.

A :class:`Subject` is a model class with one inner model class: the chain
of classes its setter call goes through (delegation included), the class
whose ``forward`` holds the capture, and the layer calling convention read
from that forward. :meth:`Subject.build` makes fresh stand-in instances.
"""

from __future__ import annotations

import ast
import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from patchcraft.reading.class_graph import FLAG, SETTER, ClassNode, ModelGraph, classes_assigned_to, read_setter
from patchcraft.planning.records import ModelPlan
from patchcraft.harness.assemble import Program, StandInModule
from patchcraft.harness.extract import PATCHED, MethodCode
from patchcraft.harness.shapes import LayerCall, embedding_attributes, has_pipeline, layer_call, norm_attributes
from patchcraft.base.status import EditKind
from patchcraft.harness.standins import (
    ForwardBatch,
    HarnessError,
    Nothing,
    PPProxyTensors,
    RecordingEmbedding,
    StandInConfig,
    StandInLayer,
    StandInNorm,
    World,
    activate,
)

LAYERS, TOKENS, HIDDEN, VOCAB = 8, 5, 8, 32
CAPTURE_IDS = [-1, 1, 4]  # hs[0], hs[2], hs[5]; 1 first, so the first-id heuristic shifts too
#: -1 means the +1 convention for the rest, so these must give hs[0], hs[3], hs[5] too, although
#: a first-id heuristic alone would keep [2, 4] raw (one meaning per config on every release).
CAPTURE_IDS_RAW_FIRST = [-1, 2, 4]
SAME_IDS = ([1, 3, 5], [2, 4, 6])
PIPELINE_IDS = [-1, 4, 6]  # the later stage holds layers 4..7
_MISSING = object()


class Failure(Exception):
    """The patched code did something wrong; the message names it."""


class Limitation(Exception):
    """The harness cannot run this model (the original fails too, or a path has no stand-in)."""

    def __init__(self, message: str, by_file: bool = False) -> None:
        super().__init__(message)
        #: The original's own code raised (e.g. it refuses a later pipeline stage itself).
        self.by_file = by_file


@dataclass
class Instance:
    """Fresh stand-in instances of one variant: the outer model (setter), the inner model (forward)."""

    variant: str
    outer: StandInModule
    inner: StandInModule
    embedding: RecordingEmbedding
    flag_after_init: Any


@dataclass
class Subject:
    """A model class with one inner model class, ready to instantiate in either variant."""

    label: str
    chain: list[tuple[ClassNode, str]]
    inner: ClassNode
    forward_owner: ClassNode
    forward: MethodCode
    call: LayerCall
    programs: dict[str, Program]
    files: set[str] = field(default_factory=set)
    embeddings: set[str] = field(default_factory=set)
    norms: set[str] = field(default_factory=set)
    #: Decoder layers of the stand-in model (the served-states run uses the target's count).
    layers: int = LAYERS

    @property
    def pipeline(self) -> bool:
        return has_pipeline(self.forward)

    def build(self, variant: str, world: World) -> Instance:
        program = self.programs[variant]
        with activate(world):
            inner: Any = program.stand_in(self.inner)()
            flag = inner.__dict__.get(FLAG, _MISSING)
            embedding = _equip(inner, world, self)
            current: StandInModule = inner
            for node, attr in reversed(self.chain):
                outer: Any = program.stand_in(node)()
                outer.equip("config", StandInConfig(self.layers, HIDDEN, VOCAB))
                outer.equip("pp_group", world.pp)
                setattr(outer, attr, current)
                current = outer
        return Instance(variant, current, inner, embedding, flag)

    def set_ids(self, instance: Instance, ids: Optional[list[int]], world: World) -> None:
        setter = getattr(instance.outer, SETTER)
        with activate(world):
            if len(inspect.signature(setter).parameters) == 0:
                setter()  # a legacy setter (0.4.x) takes no ids: SGLang calls it without them
            else:
                setter(list(ids) if ids is not None else None)

    def run(
        self,
        instance: Instance,
        world: World,
        proxy: Optional[PPProxyTensors] = None,
        *,
        tokens: Optional[torch.Tensor] = None,
        wrap: Optional[Callable[[Any], Any]] = None,
        raw: bool = False,
    ) -> Any:
        """Run the forward: the aux states it returns (``raw``: its whole result).

        ``tokens``: input ids to use (a static buffer for graph capture);
        ``wrap``: applied to the forward function first (``torch.compile``).
        """
        function = self.forward_function(instance.variant)
        method = types.MethodType(wrap(function) if wrap is not None else function, instance.inner)
        signature = inspect.signature(types.MethodType(function, instance.inner))
        inputs = {
            "input_ids": input_ids() if tokens is None else tokens,
            "positions": torch.arange(TOKENS),
            "forward_batch": ForwardBatch(),
            "input_embeds": None,
            "inputs_embeds": None,
            "pp_proxy_tensors": proxy,
        }
        with activate(world):
            result = method(**_arguments(signature, inputs))
        return result if raw else _aux_states(result)

    def forward_function(self, variant: str) -> Any:
        """The plain function of the capturing ``forward`` in ``variant`` (compiled from the file)."""
        owner: Any = self.programs[variant].stand_in(self.forward_owner)
        return owner.forward


def input_ids() -> torch.Tensor:
    return (torch.arange(TOKENS) * 7 + 3) % VOCAB


def _equip(inner: Any, world: World, subject: "Subject") -> RecordingEmbedding:
    """Give the inner model its stand-in parts where its real ``__init__`` assigns them."""
    embedding = RecordingEmbedding(VOCAB, HIDDEN, torch.Generator().manual_seed(0))
    for name in {"embed_tokens"} | subject.embeddings:
        inner.equip(name, embedding)
    layers = subject.layers
    inner.equip("layers", nn.ModuleList(StandInLayer(i, subject.call) for i in range(layers)))
    inner.equip("start_layer", 0 if world.pp.is_first_rank else layers // 2)
    inner.equip("end_layer", layers)
    for name in {"norm"} | subject.norms:
        inner.equip(name, StandInNorm())
    inner.equip("pp_group", world.pp)
    inner.equip("config", StandInConfig(layers, HIDDEN, VOCAB))
    return embedding


def _arguments(signature: inspect.Signature, inputs: dict) -> dict:
    arguments = {}
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in inputs:
            arguments[name] = inputs[name]
        elif parameter.default is parameter.empty:
            arguments[name] = Nothing(name)
    return arguments


def _aux_states(result: Any) -> list[torch.Tensor]:
    """The aux states a forward returned: a list, or one packed ``[tokens, K * hidden]`` tensor."""
    if not (isinstance(result, tuple) and len(result) == 2):
        return []
    aux = result[1]
    if isinstance(aux, torch.Tensor):
        if aux.shape[-1] % HIDDEN:
            raise Failure(f"packed aux states have width {aux.shape[-1]}, not a multiple of {HIDDEN}")
        return list(aux.split(HIDDEN, dim=-1))
    if isinstance(aux, (list, tuple)):
        return list(aux)
    return []


def setter_chain(graph: ModelGraph, cls: ClassNode) -> tuple[list[tuple[ClassNode, str]], list[ClassNode]]:
    """The classes the setter call goes through (delegation), with the attribute each holds the next in."""
    chain: list[tuple[ClassNode, str]] = []
    current = cls
    for _ in range(6):
        found = graph.find_method(current, SETTER)
        if found is None:
            raise HarnessError(f"{current.label} has no {SETTER}")
        shape = read_setter(found[1])
        attr = shape.delegate_attr or shape.inner_attr or _legacy_inner(found[1], shape.variant)
        if attr is None:
            raise HarnessError(f"{found[0].label}.{SETTER} names no inner model")
        targets = classes_assigned_to(graph, current, attr)
        if not targets:
            raise HarnessError(f"cannot tell which class `self.{attr}` of {current.label} is")
        chain.append((current, attr))
        if shape.delegate_attr is None:
            return chain, targets
        current = targets[0]
    raise HarnessError(f"{cls.label}: delegation deeper than 6 classes")


def _legacy_inner(func: Any, variant: str) -> Optional[str]:
    """The ``X`` of ``self.X.layers_to_capture = ...`` in a legacy setter (it takes no ids)."""
    if variant != "legacy":
        return None
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "layers_to_capture"
                    and isinstance(target.value, ast.Attribute)
                    and isinstance(target.value.value, ast.Name)
                    and target.value.value.id == "self"
                ):
                    return target.value.attr
    return None


def subjects(graph: ModelGraph, plan: ModelPlan, programs: dict[str, Program]) -> list[Subject]:
    cls = graph.classes.get((plan.module, plan.cls))
    if cls is None:
        raise HarnessError(f"{plan.label} is not in the model graph")
    chain, inners = setter_chain(graph, cls)
    found = []
    for inner in inners:
        owner = _forward_owner(graph, plan, inner)
        forward = programs[PATCHED].method(owner, "forward")
        assert forward is not None
        classes = [c for node, _ in chain for c in graph.mro(node)] + graph.mro(inner)
        files = {str(c.path) for c in classes}
        found.append(
            Subject(
                plan.label,
                chain,
                inner,
                owner,
                forward,
                layer_call(forward),
                programs,
                files,
                embedding_attributes(forward),
                norm_attributes(forward),
            )
        )
    return found


def _forward_owner(graph: ModelGraph, plan: ModelPlan, inner: ClassNode) -> ClassNode:
    """The class whose ``forward`` holds the capture: the plan's forward site in ``inner``'s MRO.

    A draft model may wrap its parent's forward (``super().forward``); the
    harness runs the capturing forward itself, on an instance of ``inner``.
    """
    mro = graph.mro(inner)
    keys = {(s.module, s.cls) for s in plan.sites if s.kind == EditKind.FORWARD}
    for owner in mro:
        if owner.key in keys and "forward" in owner.methods:
            return owner
    found = graph.find_method(inner, "forward")
    if found is None:
        raise HarnessError(f"{inner.label} has no forward")
    return found[0]
