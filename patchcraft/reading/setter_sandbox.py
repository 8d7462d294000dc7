"""Run a release's real ``set_eagle3_layers_to_capture`` on stand-in objects.

The id conversion in a setter is plain Python over lists of ints: the +1
rule, the first-id and max heuristics, an inner helper, delegation to a
language model, and (after ``patchcraft apply``) the -1 block. Rather than
recognise each variant by its pattern, this module compiles the setter's
own AST (annotations and decorators dropped) into a namespace with a few
safe builtins and no imports, and calls it on stand-ins for ``self``:

- ``self.config`` knows ``num_hidden_layers`` (and is its own
  ``text_config``);
- ``self.pp_group`` (and ``get_pp_group()``) is a single pipeline stage;
- every ``self.<attr>`` that an ``__init__`` in the class's MRO builds from
  a class of the model graph is a stand-in of that class, whose own setter
  (if any) is that class's real code, compiled the same way;
- an inner model has ``layers`` (one plain object per layer), and the
  ``capture_embedding_for_eagle3`` flag exactly when its ``__init__`` sets
  it (that is, when the install is patched).

Nothing from SGLang is imported, so torch is never needed. What the setter
reads that a stand-in cannot answer raises :class:`NotEvaluable`, which the
caller reports as "cannot evaluate statically"; an exception the setter
raises by itself (a ``ValueError`` for -1 on an unsupported model, an
``IndexError`` for an id past the last layer) is what SGLang would raise
at start-up, and is returned as such.

This is not a security sandbox: the code comes from the user's own SGLang
tree, which they run anyway. It only keeps the setter from touching
anything but the stand-ins.
"""

from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from patchcraft.reading.class_graph import (
    FLAG,
    SETTER,
    ClassNode,
    FunctionNode,
    ModelGraph,
    class_assigns,
    classes_assigned_to,
)

_SAFE_BUILTINS = (
    "abs all any bool dict enumerate filter getattr hasattr int isinstance len list map max min "
    "range reversed set setattr sorted str sum tuple type zip True False None "
    "AssertionError AttributeError Exception IndexError KeyError NotImplementedError RuntimeError "
    "TypeError ValueError"
).split()


class NotEvaluable(AttributeError):
    """The setter needs something the stand-ins cannot answer statically.

    It subclasses ``AttributeError`` so that ``hasattr`` on a stand-in
    behaves as on an object without that attribute.
    """


class Pipeline:
    """A single pipeline-parallel stage (the only layout -1 supports)."""

    is_first_rank = True
    is_last_rank = True
    world_size = 1
    rank_in_group = 0
    rank = 0


class Parallel:
    """What ``get_parallel()`` returns in newer releases."""

    pp_group = Pipeline()


class Config:
    """The target's config: only ``num_hidden_layers`` is known."""

    def __init__(self, num_layers: int) -> None:
        self.num_hidden_layers = num_layers

    def get_text_config(self) -> Config:
        return self

    def __getattr__(self, name: str) -> Any:
        if name.endswith("_config"):  # text_config, language_config, llm_config
            return self
        raise AttributeError(name)


class _Logger:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class Layer:
    """One decoder layer; setters only mark it (``_is_layer_to_capture``)."""


@dataclass(frozen=True)
class SetterCall:
    """One setter that ran: its class and function (delegation runs several)."""

    owner: ClassNode
    func: FunctionNode

    def __str__(self) -> str:
        return f"{self.owner.path.name}:{self.func.lineno} {self.owner.name}.{self.func.name}"


@dataclass
class Evaluation:
    """Everything one evaluation shares: the graph, the layer count, the log."""

    graph: ModelGraph
    num_layers: int
    assignments: list[tuple[StandIn, str, Any]] = field(default_factory=list)
    calls: list[SetterCall] = field(default_factory=list)
    #: Set when a stand-in could not answer, even if ``hasattr`` swallowed it.
    unknown: str | None = None
    compiled: dict[tuple[str, str], Callable[..., Any]] = field(default_factory=dict)


class StandIn:
    """An instance of a model-graph class (or of an unknown class), as a setter sees it."""

    _evaluation: Evaluation
    _cls: ClassNode | None
    _label: str

    def __init__(self, evaluation: Evaluation, cls: ClassNode | None, label: str) -> None:
        object.__setattr__(self, "_evaluation", evaluation)
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_label", label)
        if cls is not None and class_assigns(evaluation.graph, cls, "layers_to_capture"):
            object.__setattr__(self, "layers_to_capture", [])
        if cls is not None and class_assigns(evaluation.graph, cls, FLAG):
            object.__setattr__(self, FLAG, False)

    @property
    def label(self) -> str:
        return self._label

    @property
    def cls(self) -> ClassNode | None:
        return self._cls

    def __setattr__(self, name: str, value: Any) -> None:
        self._evaluation.assignments.append((self, name, value))
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:  # only called for missing attributes
        if name.startswith("__"):
            raise AttributeError(name)
        value = _attribute(self, self._evaluation, self._cls, name)
        object.__setattr__(self, name, value)
        return value


def _attribute(owner: StandIn, evaluation: Evaluation, cls: ClassNode | None, name: str) -> Any:
    n = evaluation.num_layers
    simple: dict[str, Callable[[], Any]] = {
        "config": lambda: Config(n),
        "pp_group": Pipeline,
        "layers": lambda: [Layer() for _ in range(n)],
        "start_layer": lambda: 0,
        "end_layer": lambda: n,
        "capture_aux_hidden_states": lambda: False,
    }
    if name in simple:
        return simple[name]()
    if cls is None:
        return _unknown(
            evaluation, f"{owner.label} is built from a class outside sglang/srt/models; its `{name}` is unknown"
        )
    if name == SETTER:
        found = evaluation.graph.find_method(cls, SETTER)
        if found is None:
            raise AttributeError(name)
        method = compile_method(evaluation, *found)

        def bound(*args: Any, **kwargs: Any) -> Any:
            return method(owner, *args, **kwargs)

        return bound
    children = classes_assigned_to(evaluation.graph, cls, name)
    if children:
        # Several candidates (a factory with branches): the first one is taken.
        return StandIn(evaluation, children[0], children[0].label)
    values = _assigned_values(evaluation.graph, cls, name)
    if any(isinstance(v, ast.Call) for v in values):  # built from a class the graph does not know
        return StandIn(evaluation, None, f"{cls.label}.{name}")
    if values:
        return _unknown(evaluation, f"the setter reads `{name}` of {cls.label}, whose value is not known statically")
    raise AttributeError(f"{cls.label} sets no `{name}` in __init__")


def _assigned_values(graph: ModelGraph, cls: ClassNode, name: str) -> list[ast.expr]:
    """The values ``self.<name>`` is given in the ``__init__``s of ``cls``'s MRO."""
    values: list[ast.expr] = []
    for owner in graph.mro(cls):
        init = owner.methods.get("__init__")
        for node in ast.walk(init) if init is not None else ():
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if any(_is_self_attr(t, name) for t in targets):
                values.append(value)
    return values


def _is_self_attr(node: ast.expr, name: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _unknown(evaluation: Evaluation, message: str) -> Any:
    evaluation.unknown = evaluation.unknown or message
    raise NotEvaluable(message)


# -- compiling a setter --------------------------------------------------------


def _stripped(func: FunctionNode) -> ast.FunctionDef:
    """A copy of ``func`` without annotations or decorators (they need imports)."""
    node = copy.deepcopy(func)
    node.decorator_list = []
    node.returns = None
    args = node.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    return node  # type: ignore[return-value]


def _free_names(func: ast.FunctionDef) -> set[str]:
    loaded: set[str] = set()
    stored: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
    return loaded - stored


def _namespace() -> dict[str, Any]:
    safe = {name: getattr(builtins, name) for name in _SAFE_BUILTINS}
    return {
        "__builtins__": safe,
        "get_pp_group": Pipeline,
        "get_parallel": Parallel,
        "get_pipeline_model_parallel_world_size": lambda: 1,
        "get_tensor_model_parallel_world_size": lambda: 1,
        "get_tensor_model_parallel_rank": lambda: 0,
        "logger": _Logger(),
    }


def compile_method(evaluation: Evaluation, owner: ClassNode, func: FunctionNode) -> Callable[..., Any]:
    """Compile ``owner.func`` from its AST into the restricted namespace (cached)."""
    key = (owner.label, func.name)
    if key in evaluation.compiled:
        return evaluation.compiled[key]
    node = _stripped(func)
    namespace = _namespace()
    unknown = sorted(_free_names(node) - set(namespace) - set(namespace["__builtins__"]))
    if unknown:
        raise NotEvaluable(
            f"{owner.path.name}: {owner.name}.{func.name} uses `{unknown[0]}`, which cannot be evaluated statically"
        )
    module = ast.Module(body=[node], type_ignores=[])
    ast.fix_missing_locations(module)
    exec(compile(module, str(owner.path), "exec", dont_inherit=True), namespace)  # noqa: S102 - restricted namespace
    raw = namespace[func.name]
    call = SetterCall(owner, func)

    def traced(*args: Any, **kwargs: Any) -> Any:
        evaluation.calls.append(call)
        return raw(*args, **kwargs)

    evaluation.compiled[key] = traced
    return traced


# -- running it ----------------------------------------------------------------


@dataclass(frozen=True)
class SetterRun:
    """What one call of a model's setter did to the stand-ins."""

    layers_to_capture: tuple[int, ...] | None
    embedding: bool
    holder: ClassNode | None  # the inner model whose layers_to_capture was set
    calls: tuple[SetterCall, ...]
    takes_ids: bool
    error: str | None = None  # what SGLang would raise at start-up


def takes_ids(func: FunctionNode) -> bool:
    return len(func.args.args) > 1 or bool(func.args.kwonlyargs)


def run_setter(graph: ModelGraph, cls: ClassNode, layer_ids: Sequence[int] | None, num_layers: int) -> SetterRun:
    """Call ``cls``'s real setter with ``layer_ids`` (None: the no-argument call)."""
    found = graph.find_method(cls, SETTER)
    if found is None:
        raise NotEvaluable(f"{cls.label} has no {SETTER}")
    evaluation = Evaluation(graph=graph, num_layers=num_layers)
    model = StandIn(evaluation, cls, cls.label)
    method = compile_method(evaluation, *found)
    accepts = takes_ids(found[1])
    error = None
    try:
        if accepts and layer_ids is not None:
            method(model, list(layer_ids))
        else:
            method(model)
    except NotEvaluable:
        raise
    except Exception as exc:  # the setter's own failure: SGLang would fail the same way
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if evaluation.unknown:  # swallowed by a hasattr(): the run took a branch it cannot vouch for
        raise NotEvaluable(evaluation.unknown)
    return _result(evaluation, accepts, error)


def _result(evaluation: Evaluation, accepts: bool, error: str | None) -> SetterRun:
    holder: StandIn | None = None
    for obj, name, _ in evaluation.assignments:
        if name == "layers_to_capture":
            holder = obj
    if holder is None:
        return SetterRun(None, False, None, tuple(evaluation.calls), accepts, error)
    value = object.__getattribute__(holder, "layers_to_capture")
    embedding = bool(holder.__dict__.get(FLAG, False))
    try:
        ids = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise NotEvaluable(f"the setter set layers_to_capture to {value!r}, not a list of ints") from None
    return SetterRun(ids, embedding, holder.cls, tuple(evaluation.calls), accepts, error)
