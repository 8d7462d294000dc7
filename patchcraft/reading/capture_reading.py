"""What a setter that ran and an inner model's ``forward`` capture, read from the code by rules.

The setter runs on stand-ins (:mod:`patchcraft.reading.setter_sandbox`);
what it set is read here against the ``forward`` of the class it set the
ids on: which ``layers_to_capture`` values that forward ever captures
(:func:`reachable`), where the rules cannot tell what it serves
(:func:`static_unknown`), which setter variant decided the ids
(:func:`setter_variant`) and the conversion it applied
(:func:`conversion_rule`). A ``layers_to_capture`` value ``v`` is boundary
``v``: a capture at the top of layer ``v`` (or after layer ``v-1``), which
yields Hugging Face's ``hs[v]``. ``ast`` only; nothing here runs the model.
"""

from __future__ import annotations

import ast

from patchcraft.reading.class_graph import ClassNode, ModelGraph, read_setter
from patchcraft.reading.setter_sandbox import Config, Layer, Pipeline, SetterRun


def reachable(graph: ModelGraph, holder: ClassNode | None, num_layers: int, marks: bool = True) -> frozenset[int]:
    """The ``layers_to_capture`` values the inner model's forward ever captures.

    Each ``X in self.layers_to_capture`` test in ``forward`` is evaluated
    over the layer loop: ``i`` gives 0..n-1 (top of layer i), ``i + 1``
    gives 1..n (after layer i), ``self.start_layer`` gives 0 and
    ``num_layers`` or ``self.end_layer`` gives n. A forward that gates on
    the ``_is_layer_to_capture`` marks captures at the top of the layers
    the setter marked: 0..n-1, or nothing when the setter that ran sets no
    mark (``marks`` False: Qwen3.5's EAGLE-3 setter, where only the DFLASH
    setter marks layers). A forward with neither captures nothing.
    """
    loop_top = frozenset(range(num_layers))
    found = graph.find_method(holder, "forward") if holder is not None else None
    if found is None:
        return loop_top
    forward = found[1]
    loop_vars = _loop_variables(forward)
    values: set[int] = set()
    tests = 0
    for node in ast.walk(forward):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In)):
            continue
        target = node.comparators[0]
        if not (isinstance(target, ast.Attribute) and target.attr == "layers_to_capture"):
            continue
        tests += 1
        values |= _boundaries(node.left, loop_vars, num_layers)
    if tests:
        return frozenset(values)
    # Layers marked by the setter (``_is_layer_to_capture``) capture at their top; a
    # forward with neither test nor mark never captures (the plan reports it too).
    return loop_top if marks and "_is_layer_to_capture" in ast.dump(forward) else frozenset()


def sets_marks(run: SetterRun) -> bool:
    """Whether a setter that ran marks layers (``layer._is_layer_to_capture = ...``)."""
    return any("_is_layer_to_capture" in ast.dump(call.func) for call in run.calls)


def _forward_text(graph: ModelGraph, holder: ClassNode | None) -> str:
    found = graph.find_method(holder, "forward") if holder is not None else None
    return ast.dump(found[1]) if found is not None else ""


def _loop_variables(func: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.For):
            targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


class _Self:
    """``self`` of an inner model, for evaluating a capture test's left side."""

    def __init__(self, num_layers: int) -> None:
        self.start_layer = 0
        self.end_layer = num_layers
        self.layers = [Layer() for _ in range(num_layers)]
        self.config = Config(num_layers)
        self.pp_group = Pipeline()


def _boundaries(expr: ast.expr, loop_vars: set[str], num_layers: int) -> set[int]:
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    code = compile(ast.Expression(body=expr), "<capture test>", "eval")
    scope = {"__builtins__": {"len": len}, "self": _Self(num_layers), "num_layers": num_layers}
    uses_loop = names & loop_vars
    try:
        if uses_loop:
            return {int(eval(code, scope, {v: i for v in uses_loop})) for i in range(num_layers)}  # noqa: S307
        return {int(eval(code, scope))}  # noqa: S307
    except Exception:  # an expression we cannot evaluate: assume the loop top
        return set(range(num_layers))


def static_unknown(graph: ModelGraph, run: SetterRun, reach: frozenset[int]) -> str:
    """Where rules cannot tell what the forward does with these values: say so, never guess ("" when they can)."""
    values = run.layers_to_capture or ()
    if 0 in values and 0 in reach:
        return (
            "layers_to_capture 0 is a capture at the top of layer 0, where residual is None: whether the forward "
            "crashes there, aliases the embedding or copies it is not read statically"
        )
    if any(v not in reach for v in values) and "AuxHiddenStatePacker" in _forward_text(graph, run.holder):
        return (
            "the forward's AuxHiddenStatePacker is sized for every id, and fewer are captured: its finalize() may raise"
        )
    if values and _captures_without_residual(graph, run.holder):
        return (
            "the forward appends hidden_states without the residual it carries beside it: "
            "whether that is a layer's full output is not read statically"
        )
    return ""


def _captures_without_residual(graph: ModelGraph, holder: ClassNode | None) -> bool:
    """A capture of bare ``hidden_states`` in a forward whose layers return a separate residual."""
    found = graph.find_method(holder, "forward") if holder is not None else None
    if found is None:
        return False
    forward = found[1]
    carries = any(
        isinstance(node, ast.Name) and node.id == "residual" and isinstance(node.ctx, ast.Store)
        for node in ast.walk(forward)
    )
    if not carries:
        return False
    for node in ast.walk(forward):
        if isinstance(node, ast.If) and "layers_to_capture" in ast.dump(node.test):
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "append"
                    and len(call.args) == 1
                    and isinstance(call.args[0], ast.Name)
                    and call.args[0].id == "hidden_states"
                ):
                    return True
    return False


def setter_variant(run: SetterRun) -> tuple[str, str]:
    """The setter variant that decided the ids, and its heuristic test if any."""
    for call in reversed(run.calls):
        shape = read_setter(call.func)
        if shape.variant in ("first-id-heuristic", "max-heuristic"):
            return shape.variant, _heuristic_test(call.func, shape.param or "layer_ids")
    variants = [read_setter(call.func).variant for call in run.calls]
    if "delegation" in variants and len(variants) > 1:
        return "delegation", ""
    return (variants[-1] if variants else "unknown"), ""


def _heuristic_test(func: ast.AST, param: str) -> str:
    for node in ast.walk(func):
        if isinstance(node, ast.If):
            text = ast.unparse(node.test)
            if param in text and ("max(" in text or f"{param}[" in text):
                return text
    return ""


def conversion_rule(ids: tuple[int, ...] | None, run: SetterRun, test: str) -> str:
    """Name the conversion the setter applied, by comparing its output with the ids."""
    if not run.takes_ids:
        return "the setter takes no ids: always the default layers"
    if ids is None:
        return "no ids: the default layers"
    values = run.layers_to_capture
    if values is None:
        return "the setter set no layers_to_capture"
    kept = [i for i in ids if not (run.embedding and i == -1)]
    suffix = f" (heuristic `{test}`)" if test else ""
    if list(values) == [i + 1 for i in kept]:
        return "+1 rule" + suffix
    if list(values) == kept:
        return "ids kept raw" + suffix
    return "another conversion" + suffix
