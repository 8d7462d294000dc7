"""Where a vLLM forward captures aux hidden states, found by what the code does (``ast`` only).

A capture is an ``append`` to a list (``aux_hidden_states.append(X)``)
or a call of ``EagleModelMixin._maybe_add_hidden_state(list, INDEX, ...)``,
guarded by an ``if INDEX in self.aux_hidden_state_layers`` (any attribute
named ``aux_hidden_state_layers``), or a comprehension over those ids. Its
place decides which state an id reads:

- **before the layer loop** (0.32's ``Cohere2MoeModel.forward``: ``if
  self.start_layer in self.aux_hidden_state_layers:
  aux_hidden_states.append(hidden_states)``): id 0 (the first PP rank's
  first layer) is the embedding output;
- **at the top of layer ``idx``** (``if idx in ...`` before the layer call,
  ``DeepseekV2Model.forward``): id k is layer k's input, id 0 the
  embedding output;
- **after layer ``idx``** (``if idx + 1 in ...``, or an ``if idx in ...``
  after the layer call): id k+1 is layer k's output; id 0 is never read
  there.

For id 0, the value captured says what the draft gets: ``X.clone()`` a
copy; ``X`` (or ``X if residual is None else X + residual``, or the
mixin's capture, which appends ``hidden_states`` itself when ``residual``
is None) the embedding tensor itself, which layer 0 takes as its residual
and vLLM's fused add-norm overwrites in place; ``X + residual`` alone
raises, ``residual`` being None at layer 0; anything else is said as the
expression, never guessed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

IDS_ATTR = "aux_hidden_state_layers"
MIXIN_CAPTURE = "_maybe_add_hidden_state"

BEFORE = "before the layer loop"
TOP = "at the top of each layer"
AFTER = "after each layer"
#: ``[states[i] for i in self.aux_hidden_state_layers]``: states kept elsewhere (a helper's loop), picked by id.
PICKED = "by id from states kept elsewhere"
#: What id 0 feeds, by the captured value.
COPY, ALIAS, CRASH, DROPPED, OTHER = "copy", "alias", "crash", "dropped", "other"


@dataclass(frozen=True)
class Capture:
    """One capture of a forward: where it sits, the line, and the value it appends."""

    place: str  # BEFORE, TOP or AFTER
    line: int
    value: str  # the expression, as written ("hidden_states", "hidden_states + residual", ...)
    #: For id 0 (None where this capture never reads id 0): COPY, ALIAS, CRASH or OTHER.
    id0: Optional[str]
    #: The entry appended by name is copied by the very next statement, ``C[-1] = C[-1].clone()``: the shape of
    #: the ``vllm-before-loop`` edit (its ``id0`` is then COPY).
    copied_next: bool = False


@dataclass(frozen=True)
class CaptureReading:
    """Every capture of one forward, and what id 0 feeds from it."""

    captures: tuple[Capture, ...]

    @property
    def id0(self) -> str:
        """What id 0 feeds: the first capture that reads it (COPY, ALIAS, CRASH, OTHER), or DROPPED."""
        found = next((c.id0 for c in self.captures if c.id0 is not None), None)
        if found is None and any(c.place == PICKED for c in self.captures):
            return OTHER  # what the kept states hold is not read here
        return found or DROPPED

    @property
    def id0_capture(self) -> Optional[Capture]:
        return next((c for c in self.captures if c.id0 is not None), None)

    def said(self, filename: str) -> str:
        """``captures before the layer loop (cohere2_moe.py:442) and after each layer (:450): id 0 is ...``."""
        if not self.captures:
            return "captures no aux hidden states"
        lines: dict[str, list[str]] = {}
        for capture in self.captures:
            lines.setdefault(capture.place, []).append(f":{capture.line}")
        places = [f"{place} ({filename}{', '.join(found)})" for place, found in lines.items()]
        return f"captures {' and '.join(places)}: id 0 {ID0_WORDS[self.id0]}"


ID0_WORDS = {
    COPY: "is a copy of hs[0]",
    ALIAS: "is the embedding tensor itself, not a copy (layer 0 takes it as its residual; an in-place fused "
    "add-norm overwrites it)",
    CRASH: "raises (residual is None at layer 0)",
    DROPPED: "captures nothing (no capture reads the embedding output)",
    OTHER: "is not judged by this reading (a value it does not follow)",
}


def read_captures(function: ast.AST) -> CaptureReading:
    """The captures of ``function`` (a forward), in line order."""
    loops = [n for n in ast.walk(function) if isinstance(n, ast.For)]
    layer_loops = [loop for loop in loops if _calls_layer(loop)]
    first_loop = min((loop.lineno for loop in layer_loops), default=None)
    found = []
    for guard, call, block in _guarded_captures(function):
        loop = next((lp for lp in layer_loops if _inside(call, lp)), None)
        index = guard
        value = _captured_value(call)
        if isinstance(value, ast.Name):
            value = _assigned_before(block, value.id, call.lineno) or value
        if loop is None:
            if first_loop is not None and call.lineno > first_loop:
                continue  # after the loop: the last layer's output (never id 0)
            place = BEFORE
            reads0 = index is not None
        else:
            names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            after_call = _after_layer_call(loop, call)
            plus_one = index is not None and _is_plus_one(index, names)
            place = AFTER if plus_one or after_call else TOP
            reads0 = place == TOP and index is not None and _names_loop_var(index, names)
        id0 = _id0(call, value) if reads0 else None
        copied_next = id0 == ALIAS and _copied_next(function, call)
        if id0 == ALIAS and _cloned_later(function, call.lineno):
            id0 = COPY
        said = ast.unparse(value) if value is not None else "?"
        found.append(Capture(place, call.lineno, said, id0, copied_next))
    for comp in _comprehension_captures(function):
        found.append(Capture(PICKED, comp.lineno, ast.unparse(comp.elt), None))
    return CaptureReading(tuple(sorted(found, key=lambda c: c.line)))


def _guarded_captures(function: ast.AST) -> list[tuple[Optional[ast.expr], ast.Call, Optional[ast.If]]]:
    """Each capture call with the INDEX of its guard (``INDEX in self.aux_hidden_state_layers``; the mixin's
    index argument for its capture), and the guarding ``if``."""
    found: list[tuple[Optional[ast.expr], ast.Call, Optional[ast.If]]] = []

    def visit(node: ast.AST, guard: Optional[ast.expr], where: Optional[ast.If]) -> None:
        if isinstance(node, ast.If):
            index = _guard_index(node.test)
            for child in node.body:
                visit(child, index if index is not None else guard, node if index is not None else where)
            for child in node.orelse:
                visit(child, guard, where)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == MIXIN_CAPTURE and len(node.args) >= 2:
                found.append((node.args[1], node, None))
            elif node.func.attr == "append" and guard is not None and node.args:
                found.append((guard, node, where))
        for inner in ast.iter_child_nodes(node):
            visit(inner, guard, where)

    visit(function, None, None)
    return found


def _assigned_before(block: Optional[ast.If], name: str, line: int) -> Optional[ast.expr]:
    """The value last assigned to ``name`` in ``block`` before ``line`` (``aux_hidden_state = ...``)."""
    if block is None:
        return None
    found = [
        n
        for n in block.body
        if isinstance(n, ast.Assign)
        and n.lineno < line
        and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
    ]
    return max(found, key=lambda n: n.lineno).value if found else None


def _cloned_later(function: ast.AST, line: int) -> bool:
    """``aux_hidden_states[0] = aux_hidden_states[0].clone()`` after ``line`` (0.33's MiniMax-M3)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and node.lineno > line and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if (
                isinstance(target, ast.Subscript)
                and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "clone"
                and ast.unparse(value.func.value) == ast.unparse(target)
            ):
                return True
    return False


def _copied_next(function: ast.AST, call: ast.Call) -> bool:
    """``C.append(X)`` followed in its block by ``C[-1] = C[-1].clone()``."""
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    if not isinstance(receiver, ast.Name):
        return False
    wanted = f"{receiver.id}[-1] = {receiver.id}[-1].clone()"
    for node in ast.walk(function):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for index, stmt in enumerate(block[:-1]):
                if isinstance(stmt, ast.Expr) and stmt.value is call:
                    return ast.unparse(block[index + 1]) == wanted
    return False


def _guard_index(test: ast.expr) -> Optional[ast.expr]:
    for node in ast.walk(test):
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In)
            and isinstance(node.comparators[0], ast.Attribute)
            and node.comparators[0].attr == IDS_ATTR
        ):
            return node.left
    return None


def _comprehension_captures(function: ast.AST) -> list[ast.ListComp]:
    """``[... for layer_id in self.aux_hidden_state_layers]``: states picked after the loop, by id."""
    return [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.ListComp)
        and any(isinstance(g.iter, ast.Attribute) and g.iter.attr == IDS_ATTR for g in n.generators)
    ]


def _calls_layer(loop: ast.For) -> bool:
    """A loop over the decoder layers: it calls its loop variable (``layer(...)``) or ``self.layers[...]``."""
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    for node in ast.walk(loop):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in names:
                return True
            if (
                isinstance(func, ast.Subscript)
                and isinstance(func.value, ast.Attribute)
                and func.value.attr == "layers"
            ):
                return True
    return False


def _inside(node: ast.AST, loop: ast.For) -> bool:
    return any(child is node for stmt in loop.body for child in ast.walk(stmt))


def _after_layer_call(loop: ast.For, call: ast.Call) -> bool:
    """Whether the capture comes after the layer call in the loop's body."""
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    layer_lines = [
        n.lineno
        for stmt in loop.body
        for n in ast.walk(stmt)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names
    ]
    return bool(layer_lines) and call.lineno > min(layer_lines)


def _is_plus_one(index: ast.expr, names: set[str]) -> bool:
    return (
        isinstance(index, ast.BinOp)
        and isinstance(index.op, ast.Add)
        and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(index))
    )


def _names_loop_var(index: ast.expr, names: set[str]) -> bool:
    return isinstance(index, ast.Name) and index.id in names


def _captured_value(call: ast.Call) -> Optional[ast.expr]:
    if isinstance(call.func, ast.Attribute) and call.func.attr == MIXIN_CAPTURE:
        return call.args[2] if len(call.args) > 2 else None
    return call.args[0] if call.args else None


def _id0(call: ast.Call, value: Optional[ast.expr]) -> str:
    """What id 0 feeds from this capture's value at layer 0 (``residual`` None)."""
    if isinstance(call.func, ast.Attribute) and call.func.attr == MIXIN_CAPTURE:
        return ALIAS  # the mixin appends hidden_states itself when residual is None (the mixin edit's row)
    if value is None:
        return OTHER
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "clone":
        return COPY
    if isinstance(value, ast.Name):
        return ALIAS
    if isinstance(value, ast.IfExp) and _is_none_test(value.test):
        return ALIAS if isinstance(value.body, ast.Name) else OTHER
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and _mentions(value, "residual"):
        return CRASH
    return OTHER


def _is_none_test(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.ops[0], ast.Is)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


# -- the shape ``vllm_add_embedding_capture`` edits (DeepSeek-V4), and its patched shape --------------------------


def after_layer_loop(function: ast.AST) -> Optional[ast.For]:
    """The loop ``vllm_add_embedding_capture`` edits: ``for <idx>, <layer> in enumerate(..., start=...)`` holding one
    ``if <idx> + 1 in <...>.aux_hidden_state_layers:`` with one ``.mean(dim=1)`` in it (DeepSeek-V4's capture of the
    completed streams after each layer); None when there is none (the transform checks the rest, naming it)."""
    for loop in ast.walk(function):
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call)):
            continue
        it, target = loop.iter, loop.target
        if not (
            isinstance(it.func, ast.Name)
            and it.func.id == "enumerate"
            and any(k.arg == "start" for k in it.keywords)
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and isinstance(target.elts[0], ast.Name)
        ):
            continue
        index = target.elts[0].id
        captures = [s for s in loop.body if isinstance(s, ast.If) and _after_layer_test(s.test, index)]
        if len(captures) == 1 and sum(_is_stream_mean(n) for n in ast.walk(captures[0])) == 1:
            return loop
    return None


def _after_layer_test(test: ast.expr, index: str) -> bool:
    """``<index> + 1 in <...>.aux_hidden_state_layers``."""
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.In)
        and isinstance(test.comparators[0], ast.Attribute)
        and test.comparators[0].attr == "aux_hidden_state_layers"
        and isinstance(test.left, ast.BinOp)
        and isinstance(test.left.op, ast.Add)
        and isinstance(test.left.left, ast.Name)
        and test.left.left.id == index
        and isinstance(test.left.right, ast.Constant)
        and test.left.right.value == 1
    )


def _is_stream_mean(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "mean"
        and len(node.keywords) == 1
        and node.keywords[0].arg == "dim"
        and isinstance(node.keywords[0].value, ast.Constant)
        and node.keywords[0].value.value == 1
    )


def added_capture(function: ast.AST) -> bool:
    """``vllm_add_embedding_capture``'s block right before that loop: ``if <first layer> == 0 and 0 in <ids>:``
    (the patched shape, so verify and revert find the site)."""
    loop = after_layer_loop(function)
    for node in ast.walk(function):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or loop not in body:
            continue
        index = body.index(loop)
        previous = body[index - 1] if index else None
        test = previous.test if isinstance(previous, ast.If) else None
        return (
            isinstance(test, ast.BoolOp)
            and isinstance(test.op, ast.And)
            and len(test.values) == 2
            and isinstance(zero := test.values[1], ast.Compare)
            and isinstance(zero.left, ast.Constant)
            and zero.left.value == 0
            and isinstance(zero.ops[0], ast.In)
        )
    return False
