"""Whether a vLLM EAGLE-3 capture reads a reduced state at TP > 1, read from the model code.

SGLang's decoder layers may return their MLP output before the all-reduce
and let the next layer's fused all-reduce + norm finish the sum
(:mod:`patchcraft.reading.fusion_reading`). vLLM's layers in
``model_executor/models/`` reduce inside the layer: ``RowParallelLinear``
and ``FusedMoE`` all-reduce by default, and a module built with
``reduce_results=False`` is followed, in the same layer, by
``tensor_model_parallel_all_reduce`` / ``maybe_all_reduce_tensor_model_parallel``
(or a reduce-scatter). vLLM's compile-time all-reduce + RMSNorm fusion is a
graph rewrite that cannot change a captured value (docs/vllm.md). So a
capture of ``hidden_states + residual`` (the loop's own, or
``EagleModelMixin._maybe_add_hidden_state``) reads a per-rank partial sum
only where a layer's code leaves its output unreduced: a submodule built
with ``reduce_results=False`` whose call is the last thing the layer's
forward does before it returns, with no reduction after it.

Per EAGLE-3 target class: reduced (the layers' evidence), partial sum (the
layer class, file and line that leaves it unreduced) or not read (why).
``ast`` only; it keys on structure, never on a release or a file name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional

from patchcraft.base.memo import Memo, Stamp, stamp
from patchcraft.reading.class_graph import ClassNode, FunctionNode, ModelGraph, classes_assigned_to, nodes_of, words_of
from patchcraft.reading.vllm_graph import DRAFTS, SETTER, VllmGraph, language_model

#: The attribute vLLM's setter fills on the inner model, and the mixin's capture helper.
GATE = "aux_hidden_state_layers"
MIXIN_CAPTURE = "_maybe_add_hidden_state"
#: Call names (their last part) that complete a tensor-parallel sum.
_REDUCTIONS = ("all_reduce", "allreduce", "reduce_scatter")

#: What a file holds to be read: a target's name, the setter, the ids' attribute or the mixin.
_TARGET_WORDS = (b"ForCausalLM", b"ForConditionalGeneration", SETTER.encode(), GATE.encode())

REDUCED = "reduced"
PARTIAL = "partial sum"
NOT_READ = "not read"


@dataclass(frozen=True)
class Unreduced:
    """A decoder layer whose forward returns a submodule's output built with ``reduce_results=False``, unreduced."""

    layer: str  # module.Class
    path: Path
    line: int  # the ``reduce_results=False`` constructor
    attr: str  # self.<attr>

    def where(self, root: Path | None = None) -> str:
        shown = self.path.relative_to(root) if root is not None and self.path.is_relative_to(root) else self.path.name
        return f"{self.layer} ({shown}:{self.line}, self.{self.attr} built with reduce_results=False)"


@dataclass(frozen=True)
class Reduction:
    """What one EAGLE-3 target's capture reads at TP > 1."""

    model: str  # module.Class of the target
    path: Path
    verdict: str  # REDUCED, PARTIAL or NOT_READ
    #: ``file:line`` of the capture (``forward`` or the mixin's helper), "" when not read.
    capture: str
    #: The layers run by the inner model that leave their output unreduced (PARTIAL's cause).
    unreduced: tuple[Unreduced, ...]
    #: The decoder layers read (``module.Class``).
    layers: tuple[str, ...]
    #: One line: the evidence, or why nothing was read.
    evidence: str

    @property
    def partial(self) -> bool:
        return self.verdict == PARTIAL


def read_tree(package: Path) -> list[Reduction]:
    """One record per EAGLE-3 target class of ``package``'s ``model_executor/models``, in file then name order."""
    graph = _loaded_graph(package / "model_executor" / "models")
    return [read_target(graph, cls) for cls in targets(graph)]


def read_model(package: Path, name: str) -> Optional[Reduction]:
    """The record of ``name`` (a class name, a ``module.Class`` label or a file stem), or None when no target.

    Kept while no file it read changes (:mod:`patchcraft.base.memo`): check-draft explains again for each fix it
    proves, and each explanation reads this."""
    models = package / "model_executor" / "models"

    def read() -> Stamp:
        return stamp(folders=[(models, False), (package / "models", True)])

    return _READ.get((str(models.resolve()), name), read, lambda: _read_model(models, name))


#: The records read, by models folder and name.
_READ: "Memo[Optional[Reduction]]" = Memo(keep=16)


def _read_model(models: Path, name: str) -> Optional[Reduction]:
    graph = _loaded_graph(models)
    for cls in targets(graph):
        if name in (cls.name, cls.label, cls.module):
            return read_target(graph, cls)
    return None


def targets(graph: ModelGraph) -> list[ClassNode]:
    """The EAGLE-3 targets: a ``...ForCausalLM`` / ``...ForConditionalGeneration`` with the setter, no draft."""
    return [
        node
        for node in sorted(graph.classes.values(), key=lambda c: (str(c.path), c.name))
        if node.name.endswith(("ForCausalLM", "ForConditionalGeneration"))
        and not DRAFTS.search(node.name)
        and graph.find_method(node, SETTER) is not None
    ]


def read_target(graph: ModelGraph, outer: ClassNode) -> Reduction:
    """Read the inner model's capture and the layers it runs."""
    inners = classes_assigned_to(graph, outer, "model")
    named = language_model(graph, outer) if not inners else None
    inner_outer = next((c for c in targets(graph) if named and c.name == named[0] and c is not outer), None)
    if inner_outer is not None and named is not None:
        through = read_target(graph, inner_outer)
        return replace(
            through,
            model=outer.label,
            path=outer.path,
            evidence=f"through its language model {through.model} ({named[1]}): {through.evidence}",
        )
    if not inners:
        return _not_read(
            outer, "its inner model (`self.model`) is not built in its code (a language model from the registry)"
        )
    inner = inners[0]
    forward = _capturing_forward(graph, inner)
    if forward is None:
        return _not_read(outer, f"{inner.label} has no forward that captures aux hidden states")
    owner, func, line = forward
    capture = f"{owner.path.name}:{line}"
    layers = list({c.label: c for c in _named_classes(graph, inner) if "forward" in _methods(graph, c)}.values())
    found = tuple(u for u in (_unreduced(graph, layer) for layer in layers) if u is not None)
    names = tuple(c.label for c in layers)
    if not layers:
        return Reduction(
            outer.label,
            outer.path,
            NOT_READ,
            capture,
            (),
            (),
            f"no decoder layer class of {inner.label} is in the models directory",
        )
    if not _sums(func):
        return Reduction(
            outer.label,
            outer.path,
            REDUCED,
            capture,
            found,
            names,
            f"{owner.label}.forward captures after a norm, not hidden_states + residual",
        )
    if found:
        first = found[0]
        return Reduction(
            outer.label, outer.path, PARTIAL, capture, found, names,
            f"{owner.label}.forward (line {line}) captures hidden_states + residual, and {first.where()} "
            "leaves its output unreduced for the next layer's all-reduce",
        )  # fmt: skip
    return Reduction(
        outer.label, outer.path, REDUCED, capture, (), names,
        f"every layer {inner.label} runs ({', '.join(c.name for c in layers)}) reduces its output inside itself "
        f"before {owner.label}.forward's capture at line {line}",
    )  # fmt: skip


def _not_read(outer: ClassNode, why: str) -> Reduction:
    return Reduction(outer.label, outer.path, NOT_READ, "", (), (), why)


def _loaded_graph(models: Path) -> ModelGraph:
    graph = VllmGraph(models)
    for path in sorted(models.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(word in data for word in _TARGET_WORDS):
            graph.load(path.stem, data)
    return graph


def _methods(graph: ModelGraph, cls: ClassNode) -> dict[str, FunctionNode]:
    found: dict[str, FunctionNode] = {}
    for owner in reversed(graph.mro(cls)):
        found.update(owner.methods)
    return found


# -- the capture ------------------------------------------------------------------


def _capturing_forward(graph: ModelGraph, inner: ClassNode) -> Optional[tuple[ClassNode, FunctionNode, int]]:
    """The ``forward`` that captures (gated on the ids or through the mixin), following ``super().forward``."""
    for owner in graph.mro(inner):
        forward = owner.methods.get("forward")
        if forward is None:
            continue
        line = _capture_line(forward)
        if line is not None:
            return owner, forward, line
        if "super" not in words_of(forward):
            return None
    return None


def _capture_line(func: FunctionNode) -> Optional[int]:
    """The first line that captures: an id-gated ``if`` or a call of the mixin's helper."""
    lines = [
        node.lineno
        for node in nodes_of(func)
        if (isinstance(node, ast.If) and GATE in words_of(node.test))
        or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == MIXIN_CAPTURE)
    ]
    return min(lines, default=None)


def _is_sum(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and {getattr(node.left, "id", None), getattr(node.right, "id", None)} == {"hidden_states", "residual"}
    )


def _sums(func: FunctionNode) -> bool:
    """A capture of ``hidden_states + residual``: in an id-gated block, or the mixin's helper given both."""
    for node in nodes_of(func):
        if isinstance(node, ast.If) and GATE in words_of(node.test) and any(_is_sum(n) for n in nodes_of(node)):
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == MIXIN_CAPTURE
            and {"hidden_states", "residual"} <= {getattr(a, "id", None) for a in node.args}
        ):
            return True
    return False


# -- the layers -------------------------------------------------------------------


def _named_classes(graph: ModelGraph, inner: ClassNode) -> Iterator[ClassNode]:
    """Model classes named in the building methods of ``inner`` and its bases (layer types passed to a base count)."""
    for owner in graph.mro(inner):
        for name, func in owner.methods.items():
            if name in ("forward", "load_weights"):
                continue
            for node in nodes_of(func):
                if isinstance(node, ast.Name):
                    cls = graph.resolve(owner.module, node.id)
                    if cls is not None and cls is not inner:
                        yield cls


def _built_unreduced(graph: ModelGraph, cls: ClassNode) -> dict[str, int]:
    """``self.X = C(..., reduce_results=False)`` in an ``__init__`` of ``cls``'s MRO: ``{X: line}``."""
    found: dict[str, int] = {}
    for owner in graph.mro(cls):
        init = owner.methods.get("__init__")
        for node in nodes_of(init) if init is not None else ():
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            if not any(
                k.arg == "reduce_results" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in node.value.keywords
            ):
                continue
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    found.setdefault(target.attr, node.value.lineno)
    return found


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _calls_in_order(graph: ModelGraph, cls: ClassNode, func: FunctionNode, depth: int = 0) -> Iterator[ast.Call]:
    """The calls of ``func`` in source order, a ``self.method(...)`` of ``cls`` read in place."""
    methods = _methods(graph, cls)
    calls = sorted((n for n in nodes_of(func) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        yield call
        name = _call_name(call)
        if depth < 3 and _is_self_call(call) and name in methods and name != "forward":
            yield from _calls_in_order(graph, cls, methods[name], depth + 1)


def _is_self_call(call: ast.Call) -> bool:
    return (
        isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"
    )


def _unreduced(graph: ModelGraph, layer: ClassNode) -> Optional[Unreduced]:
    """The submodule whose unreduced output the layer's forward returns, if any."""
    built = _built_unreduced(graph, layer)
    forward = _methods(graph, layer).get("forward")
    if not built or forward is None:
        return None
    methods = _methods(graph, layer)
    pending: Optional[str] = None
    for call in _calls_in_order(graph, layer, forward):
        name = _call_name(call)
        if any(word in name for word in _REDUCTIONS):
            pending = None
        elif _is_self_call(call) and name not in methods:
            pending = name if name in built else None  # the output of the submodule called last
    if pending is None:
        return None
    owner = next(
        (c for c in graph.mro(layer) if c.methods.get("__init__") is not None and pending in _built_unreduced_own(c)),
        layer,
    )
    return Unreduced(layer.label, owner.path, built[pending], pending)


def _built_unreduced_own(cls: ClassNode) -> set[str]:
    init = cls.methods.get("__init__")
    names: set[str] = set()
    for node in nodes_of(init) if init is not None else ():
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names
