"""Which EAGLE-3 captures read a deferred all-reduce sum, found through the class graph.

With FlashInfer all-reduce fusion on, a decoder layer whose forward asks
``LayerCommunicator.should_fuse_mlp_allreduce_with_next_layer`` may return
its MLP output *before* the all-reduce; the next layer's input norm
(``prepare_attn``) completes the sum. A capture of ``hidden_states +
residual`` at the top of layer ``i`` (in the inner model's loop, or in a
helper the loop calls) then reads a per-rank partial sum. A capture the
layer makes itself (``captured_last_layer_outputs=`` handed to the layer,
read after ``prepare_attn``) reads the reduced state.

This module answers, for each model class with an EAGLE-3 setter (its own
or inherited, through delegating setters too), which of the two its capture
is, and which decoder layers defer their all-reduce (inherited layers and
layer classes chosen by a base's ``__init__`` count). It is the one
detection used by the fusion edit, ``explain --tp``, ``check-draft --tp`` and
the ``allreduce-fusion`` row. ``ast`` only; it keys on structure, never on a
release or a file name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.sources import decode
from patchcraft.reading.parsed import parse_python
from patchcraft.reading.class_graph import (
    SETTER,
    ClassNode,
    FunctionNode,
    ModelGraph,
    SiteParams,
    constructors_of,
    nodes_of,
    read_setter,
    words_of,
)

#: The decision a decoder layer asks before it defers its all-reduce.
DECISION = "should_fuse_mlp_allreduce_with_next_layer"
#: What the patched setter sets on a layer's communicator: a capture reads this layer's output.
MARK = "patchcraft_output_captured"
_CAPTURE_KEYWORDS = ("captured_last_layer_outputs", "capture_output")
#: What a capture is gated on: the ids, or the flag an inner setter puts on each captured layer (qwen2_moe).
_GATES = ("layers_to_capture", "_is_layer_to_capture")


@dataclass(frozen=True)
class MarkParams(SiteParams):
    """``fusion-mark``: the inner model the setter sets ids on, and its layers' communicator attribute."""

    target: str = "self.model"
    communicator: str = "layer_communicator"


@dataclass(frozen=True)
class FusionCapture:
    """What one EAGLE-3 model's capture reads at TP > 1 with all-reduce fusion on."""

    #: The model class (``module.Class``) and its file.
    model: str
    path: Path
    #: The class whose setter sets the ids, its file, and the inner model it sets them on (``self.model``).
    setter_cls: str
    setter_path: Path
    target: str
    #: ``module.Class`` of the forward that captures, and its file.
    forward: str
    forward_path: Path
    #: True: some capture reads ``hidden_states + residual`` before the next layer's norm.
    reads_deferred_sum: bool
    #: Decoder layers the forward runs that defer their all-reduce (``module.Class``).
    deferring_layers: tuple[str, ...]
    #: The attribute of those layers that holds the communicator (``layer_communicator``).
    communicator: str
    #: One line: where the capture is and what it reads.
    evidence: str

    @property
    def affected(self) -> bool:
        """A capture reads a partial sum: the layers defer, and the capture precedes the reduction."""
        return self.reads_deferred_sum and bool(self.deferring_layers)

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys((self.path, self.setter_path, self.forward_path)))


def eagle3_models(graph: ModelGraph) -> Iterator[ClassNode]:
    """Every loaded class with ``set_eagle3_layers_to_capture``, its own or inherited."""
    for cls in list(graph.classes.values()):
        if graph.find_method(cls, SETTER) is not None:
            yield cls


def read_capture(graph: ModelGraph, cls: ClassNode, _depth: int = 0) -> Optional[FusionCapture]:
    """What the capture of model class ``cls`` reads, or None when its setter reaches no capture."""
    found = graph.find_method(cls, SETTER)
    if found is None or _depth > 4:
        return None
    owner, setter = found
    shape = read_setter(setter)
    if shape.delegate_attr is not None:
        for target in constructors_of(graph, cls, shape.delegate_attr)[0]:
            inner = read_capture(graph, target, _depth + 1)
            if inner is not None:
                return replace(inner, model=cls.label, path=cls.path)
        return None
    if shape.inner_attr is None:
        return None
    for inner_cls in constructors_of(graph, cls, shape.inner_attr)[0]:
        forward = _capturing_forward(graph, inner_cls)
        if forward is None:
            continue
        forward_owner, func = forward
        deferred, evidence = _reads_deferred_sum(graph, inner_cls, func)
        layers, communicator = _deferring_layers(graph, inner_cls)
        return FusionCapture(
            model=cls.label, path=cls.path, setter_cls=owner.name, setter_path=owner.path, target=f"self.{shape.inner_attr}",
            forward=forward_owner.label, forward_path=forward_owner.path, reads_deferred_sum=deferred,
            deferring_layers=layers, communicator=communicator, evidence=f"{forward_owner.label}.forward: {evidence}",
        )  # fmt: skip
    return None


def captures(graph: ModelGraph) -> list[FusionCapture]:
    """One record per EAGLE-3 model class whose setter reaches a capture, in file then name order."""
    found = [c for c in (read_capture(graph, cls) for cls in eagle3_models(graph)) if c is not None]
    return sorted(found, key=lambda c: (str(c.path), c.model))


def affected(graph: ModelGraph) -> list[FusionCapture]:
    """The models whose EAGLE-3 capture reads a per-rank partial sum at TP > 1."""
    return [c for c in captures(graph) if c.affected]


# -- the capture ------------------------------------------------------------------


def _capturing_forward(graph: ModelGraph, inner: ClassNode) -> Optional[tuple[ClassNode, FunctionNode]]:
    """The ``forward`` that reads ``layers_to_capture``, following ``super().forward(...)``."""
    for owner in graph.mro(inner):
        forward = owner.methods.get("forward")
        if forward is None:
            continue
        if not words_of(forward).isdisjoint(_GATES):
            return owner, forward
        if "super" not in words_of(forward):
            return None
    return None


def _is_partial_sum(node: ast.AST) -> bool:
    """``hidden_states + residual`` (either order): the state before the next layer's norm."""
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.left, ast.Name)
        and isinstance(node.right, ast.Name)
        and {node.left.id, node.right.id} == {"hidden_states", "residual"}
    )


def _helper(graph: ModelGraph, inner: ClassNode, call: ast.Call) -> Optional[FunctionNode]:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        found = graph.find_method(inner, func.attr)
        return found[1] if found is not None else None
    return None


def _reads_sum(graph: ModelGraph, inner: ClassNode, expr: ast.AST) -> bool:
    """``expr`` is, or calls a helper of the inner model that computes, ``hidden_states + residual``."""
    for node in nodes_of(expr):
        if _is_partial_sum(node):
            return True
        if isinstance(node, ast.Call):
            helper = _helper(graph, inner, node)
            if helper is not None and any(_is_partial_sum(n) for n in nodes_of(helper)):
                return True
    return False


def _gated_blocks(func: FunctionNode) -> Iterator[ast.If]:
    """``if ... layers_to_capture ...:`` blocks: the id-gated captures of the loop."""
    for node in nodes_of(func):
        if isinstance(node, ast.If) and "layers_to_capture" in words_of(node.test):
            yield node


def _reads_deferred_sum(graph: ModelGraph, inner: ClassNode, func: FunctionNode) -> tuple[bool, str]:
    """Whether an id-gated capture of ``func`` reads ``hidden_states + residual``, and where."""
    for block in _gated_blocks(func):
        for stmt in block.body:
            for node in nodes_of(stmt):
                if _reads_sum(graph, inner, node) and isinstance(node, (ast.Call, ast.Assign)):
                    return (
                        True,
                        f"line {node.lineno} captures hidden_states + residual at the top of a layer, before its norm reduces it",
                    )
    for node in nodes_of(func):
        if (
            isinstance(node, ast.keyword)
            and node.arg in _CAPTURE_KEYWORDS
            and not words_of(node.value).isdisjoint(_GATES)
        ):
            return (
                False,
                f"line {node.value.lineno} hands the collector to the layer ({node.arg}=), which captures after its norm reduced the sum",
            )
    return False, "no capture of hidden_states + residual before a layer's norm"


# -- the layers -------------------------------------------------------------------


def _named_classes(graph: ModelGraph, inner: ClassNode) -> Iterator[ClassNode]:
    """Classes named in the ``__init__`` of ``inner`` and its bases (layer types passed to a base count)."""
    for owner in graph.mro(inner):
        init = owner.methods.get("__init__")
        if init is None:
            continue
        for node in nodes_of(init):
            if isinstance(node, ast.Name):
                cls = graph.resolve(owner.module, node.id)
                if cls is not None:
                    yield cls


def _communicator_of(graph: ModelGraph, layer: ClassNode) -> Optional[str]:
    """``X`` in ``self.X.should_fuse_mlp_allreduce_with_next_layer(...)`` in ``layer`` or its bases."""
    for owner in graph.mro(layer):
        for func in owner.methods.values():
            for node in nodes_of(func):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == DECISION
                    and isinstance(node.value, ast.Attribute)
                    and isinstance(node.value.value, ast.Name)
                    and node.value.value.id == "self"
                ):
                    return node.value.attr
    return None


def _deferring_layers(graph: ModelGraph, inner: ClassNode) -> tuple[tuple[str, ...], str]:
    layers: dict[str, None] = {}
    communicator = ""
    for cls in _named_classes(graph, inner):
        attr = _communicator_of(graph, cls)
        if attr is not None:
            layers.setdefault(cls.label, None)
            communicator = communicator or attr
    return tuple(layers), communicator


# -- overrides of the decision ------------------------------------------------------


@dataclass(frozen=True)
class Override:
    """A subclass of ``LayerCommunicator`` whose decision returns before the base's (guarded) code runs."""

    path: Path
    cls: str
    line: int
    #: Model files that name the class (those whose layers may use it).
    users: tuple[str, ...]


def overrides(layers_dir: Path, models_dir: Path) -> list[Override]:
    """Subclasses of ``LayerCommunicator`` under ``layers_dir`` whose decision can return True
    before it calls ``super()``: the guard in the base does not run for them."""
    found = []
    for path in sorted(layers_dir.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if DECISION.encode() not in data or b"LayerCommunicator" not in data:
            continue
        try:
            module = parse_python(decode(path, data).text)
        except (SyntaxError, ValueError, PatchcraftError):
            continue
        for stmt in module.body:
            if isinstance(stmt, ast.ClassDef) and any("LayerCommunicator" in ast.unparse(b) for b in stmt.bases):
                line = _early_return(stmt)
                if line is not None:
                    found.append(Override(path, stmt.name, line, _users(models_dir, stmt.name)))
    return found


def _early_return(cls: ast.ClassDef) -> Optional[int]:
    """The line of a return other than ``False`` before ``super().<decision>`` in the decision, if any."""
    for item in cls.body:
        if not (isinstance(item, ast.FunctionDef) and item.name == DECISION):
            continue
        for node in ast.walk(item):
            if isinstance(node, ast.Return) and not (
                isinstance(node.value, ast.Constant) and node.value.value is False
            ):
                if "super" not in words_of(node):
                    return node.lineno
    return None


def _users(models_dir: Path, name: str) -> tuple[str, ...]:
    users = []
    for path in sorted(models_dir.glob("*.py")):
        try:
            if name.encode() in path.read_bytes():
                users.append(path.stem)
        except OSError:
            continue
    return tuple(users)
