"""Edit 3: in the inner model's ``forward``, capture the embedding output right before the layer loop.

The capture goes immediately before the loop that captures the other
layers (or the earliest capture that precedes it), inside whatever branch
holds that loop. There, ``hidden_states`` is what layer 0 receives: the
embedding output, on the first pipeline stage. So layer id -1 behaves
exactly like a capture at the top of layer 0, on every path: a
two-batch-overlap branch that bypasses the loop captures no layer, and
no embedding either.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional, Sequence

import libcst as cst

from patchcraft.reading.class_graph import CAPTURE_KEYWORDS
from patchcraft.planning.records import EditSite, ForwardParams
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.transforms._base import (
    FLAG,
    FLAG_COUNT,
    FLAG_READ,
    LEGACY_FLAG_READS,
    AnchorError,
    Outcome,
    edit_method,
    find_statements,
    insert_at,
    is_flag_count,
    is_marked,
    iter_nodes,
    line_of,
    marked_statement,
    replace_statement,
    strip_marker_lines,
    walk_statements,
)
from patchcraft.transforms._definite_assignment import binds, bound_on_every_path, bound_on_some_path

NAME = "capture_embedding_output"
KIND = EditKind.FORWARD
DESCRIPTION = (
    "Right before the layer loop that captures aux hidden states (in its own branch), append "
    "a copy of the embedding output when the flag is set, on the first pipeline stage only; "
    "a preallocated collector (AuxHiddenStatePacker) gets room for one more capture."
)
#: The embedding at the loop top; a copy, because fused add-norm kernels update
#: layer 0's residual (this same tensor) in place.
SEED_EXPRESSION = "hidden_states.clone() if residual is None else hidden_states + residual"
NO_RESIDUAL_EXPRESSION = "hidden_states.clone()"
#: The same, for a collector whose ``append`` copies (``ForwardParams.copies``): no second copy.
COPIED_SEED_EXPRESSION = "hidden_states if residual is None else hidden_states + residual"
COPIED_NO_RESIDUAL_EXPRESSION = "hidden_states"


def block(site: EditSite, collector: str, expression: str, method: str = "append", flag: str = FLAG_READ) -> str:
    """The inserted capture block, for a collector and the release's capture call.

    ``flag`` is how the block reads the flag (:data:`FLAG_READ`; an earlier
    patchcraft read ``self.<flag>``, see :data:`LEGACY_FLAG_READS`).
    """
    gate = site.params_as(ForwardParams).gate
    test = f"{flag} and {gate}" if gate else flag
    if method == "capture":
        # The release's own primitive (AuxHiddenStateList.capture) copies.
        call = f"    {collector}.capture(hidden_states)\n"
    elif expression in (NO_RESIDUAL_EXPRESSION, COPIED_NO_RESIDUAL_EXPRESSION):
        call = f"    {collector}.append({expression})\n"
    else:
        call = f"    {collector}.append(\n        {expression}\n    )\n"
    return (
        "# patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only\n"
        f"if {test}:\n"
        f"{call}"
    )


@dataclass
class Capture:
    """What ``forward`` looks like around its capture loop."""

    collector: str
    collector_stmt: cst.BaseStatement
    anchor: cst.BaseStatement  # insert right before this statement
    method: str  # "append" | "capture"
    expression: str
    count: Optional[cst.Arg]  # the preallocated capture count, if any
    #: The block holding the anchor, the anchor's position in it, and where the collector must precede.
    statements: Sequence[cst.BaseStatement] = ()
    index: int = 0
    chain: Sequence = ()
    collector_chain: Sequence = ()

    def precedes(self, position: int) -> bool:
        """Whether the collector is created before statement ``position`` of the anchor's block."""
        return _precedes(self.collector_chain, self.chain, position)


_nodes = iter_nodes


def _idents(node: cst.CSTNode) -> set:
    """Names and attribute names used under ``node``, and short string literals
    (``getattr(layer, "_is_layer_to_capture", False)`` names an attribute too)."""
    found = set()
    for child in _nodes(node):
        if isinstance(child, cst.Name):
            found.add(child.value)
        elif isinstance(child, cst.SimpleString) and len(child.value) < 64:
            found.add(child.value.strip("\"'"))
    return found


def _mentions_capture(node: cst.CSTNode) -> bool:
    return not _idents(node).isdisjoint(("layers_to_capture", "_is_layer_to_capture"))


def _capture_loops(walked: Sequence) -> list:
    """Outermost ``for``/``while`` statements that capture (mention the capture ids or flags)."""
    loops = [(s, chain) for s, chain in walked if isinstance(s, (cst.For, cst.While)) and _mentions_capture(s)]
    ids = {id(s) for s, _ in loops}
    return [(s, chain) for s, chain in loops if not any(id(block.body[i]) in ids for block, i in chain[:-1])]


def _collector_names(loops: Sequence) -> set:
    """Names the loops capture into: ``NAME.append/capture(...)``, ``NAME.capture``, or by keyword."""
    names: set = set()
    for loop, _ in loops:
        for node in _nodes(loop):
            if (
                isinstance(node, cst.Attribute)
                and isinstance(node.value, cst.Name)
                and node.attr.value in ("append", "capture")
            ):
                names.add(node.value.value)
            elif isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in CAPTURE_KEYWORDS:
                names.update(n.value for n in _nodes(node.value) if isinstance(n, cst.Name))
    return names


def _method_of(func: cst.FunctionDef, name: str) -> str:
    """``capture`` when the forward uses its collector's own ``.capture`` (which copies)."""
    for node in _nodes(func.body):
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value == "capture"
            and isinstance(node.value, cst.Name)
            and node.value.value == name
        ):
            return "capture"
    return "append"


def _collector_value(stmt: cst.BaseStatement) -> tuple[Optional[str], Optional[cst.BaseExpression]]:
    """``NAME = []`` or ``NAME = Collector(...)`` (optionally annotated) -> (NAME, value)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None, None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target, value = small.targets[0].target, small.value
    elif isinstance(small, cst.AnnAssign) and small.value is not None:
        target, value = small.target, small.value
    else:
        return None, None
    if not isinstance(target, cst.Name):
        return None, None
    if isinstance(value, cst.List) and not value.elements:
        return target.value, value
    if isinstance(value, cst.Call):
        return target.value, value
    return None, None


def _common_block(chains: Sequence) -> tuple[int, int]:
    """The deepest block holding every chain (its depth), and the first position used there."""
    depth = 0
    while True:
        if len({id(c[depth][0]) for c in chains}) != 1:
            depth -= 1  # the chains went into different branches of one statement
            break
        if len({c[depth][1] for c in chains}) > 1 or any(len(c) == depth + 1 for c in chains):
            break
        depth += 1
    return depth, min(c[depth][1] for c in chains)


def _count_arg(value: cst.BaseExpression) -> Optional[cst.Arg]:
    """The argument sizing a preallocated collector: one that mentions the capture ids."""
    if not isinstance(value, cst.Call):
        return None
    for arg in value.args:
        if "layers_to_capture" in _idents(arg.value):
            return arg
    return None


def analyse(func: cst.FunctionDef, site: EditSite) -> Capture:
    """Find the collector, the capture loop and where the embedding capture goes."""
    walked = walk_statements(func)
    loops = _capture_loops(walked)
    if not loops:
        raise AnchorError(site, "a layer loop that captures aux hidden states (mentions layers_to_capture)")
    names = _collector_names(loops)
    collectors = [(s, chain) for s, chain in walked if _collector_value(s)[0] in names]
    found = {str(_collector_value(s)[0]) for s, _ in collectors}
    if not collectors:
        raise AnchorError(site, "an aux collector such as `aux_hidden_states = []` before the layer loop")
    if len(collectors) > 1:
        raise AnchorError(site, f"one aux collector, found {len(collectors)} ({', '.join(sorted(found))}); ambiguous")
    collector_stmt, collector_chain = collectors[0]
    name, value = _collector_value(collector_stmt)
    assert name is not None and value is not None
    depth, index = _common_block([chain for _, chain in loops])
    block_node = loops[0][1][depth][0]
    statements = list(block_node.body)
    # Captures right before the loop (a boundary-0 capture) come after ours.
    while index > 0 and statements[index - 1] is not collector_stmt and _captures_into(statements[index - 1], name):
        index -= 1
    chain = loops[0][1][: depth + 1]
    if not _precedes(collector_chain, chain, index):
        raise AnchorError(site, f"`{name} = ...` before the layer loop that captures into it")
    point = (*chain[:-1], (block_node, index))
    # ``hidden_states`` needs no proof: the loop reads it at this very point, before any rebinding.
    if not bound_on_some_path(func, point, "hidden_states"):
        raise AnchorError(site, "`hidden_states` bound before the capture loop (the embedding output at the loop top)")
    method = _method_of(func, name)
    # The residual is read only where every path has bound it (0.5.12 Gemma4 binds it inside the loop).
    with_residual = bound_on_every_path(func, point, "residual")
    if method == "append" and site.params_as(ForwardParams).copies:
        expression = COPIED_SEED_EXPRESSION if with_residual else COPIED_NO_RESIDUAL_EXPRESSION
    else:
        expression = SEED_EXPRESSION if with_residual else NO_RESIDUAL_EXPRESSION
    return Capture(
        name,
        collector_stmt,
        statements[index],
        method,
        expression,
        _count_arg(value),
        statements,
        index,
        chain,
        collector_chain,
    )


def _captures_into(stmt: cst.BaseStatement, name: str) -> bool:
    return _mentions_capture(stmt) and name in _collector_names([(stmt, ())])


def _precedes(collector_chain: Sequence, loop_chain: Sequence, index: int) -> bool:
    """Whether the collector statement runs before statement ``index`` of the loop's block."""
    for depth, (block_node, position) in enumerate(collector_chain):
        if depth >= len(loop_chain) or loop_chain[depth][0] is not block_node:
            return False
        limit = index if depth == len(loop_chain) - 1 else loop_chain[depth][1]
        if depth == len(collector_chain) - 1:
            return position < limit
        if position != limit:
            return False
    return False


class _WidenCount(cst.CSTTransformer):
    """``NAME = Packer(len(self.layers_to_capture))`` -> ``Packer(len(...) + int(getattr(self, <flag>, False)))``.

    An earlier patchcraft's widening (``+ int(self.<flag>)``) is brought to the current form.
    """

    def __init__(self, collector: str) -> None:
        super().__init__()
        self.collector = collector

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # not into nested defs

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        target = updated.targets[0].target if len(updated.targets) == 1 else None
        if not (
            isinstance(target, cst.Name) and target.value == self.collector and isinstance(updated.value, cst.Call)
        ):
            return updated
        count = _count_arg(updated.value)
        if count is None or is_flag_count(count.value, current_only=True):
            return updated
        if is_flag_count(count.value):
            widened = count.with_changes(value=count.value.with_changes(right=cst.parse_expression(FLAG_COUNT)))
        else:
            widened = count.with_changes(
                value=cst.BinaryOperation(left=count.value, operator=cst.Add(), right=cst.parse_expression(FLAG_COUNT))
            )
        args = [widened if a is count else a for a in updated.value.args]
        return updated.with_changes(value=updated.value.with_changes(args=args))


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    capture = analyse(func, site)
    canonical = marked_statement(module, block(site, capture.collector, capture.expression, capture.method))
    marked = find_statements(func, is_marked)
    needs_count = capture.count is not None and not is_flag_count(capture.count.value, current_only=True)
    if marked:
        found = strip_marker_lines(module, marked[0])
        if found == strip_marker_lines(module, canonical):
            if not needs_count:
                return func, Outcome(EditStatus.PRESENT)
        elif found in _legacy_blocks(module, site, capture):
            func = replace_statement(func, marked[0], canonical)  # an earlier patchcraft's block: brought up to date
        else:
            return func, Outcome(
                EditStatus.MODIFIED,
                f"line {line_of(module, marked[0])}: the inserted capture block was changed by hand",
            )
    else:
        hand = find_statements(func, lambda s: isinstance(s, cst.If) and FLAG in _idents(s.test))
        if hand:
            problem = judge_hand_fix(module, capture, hand)
            if problem:
                return func, Outcome(EditStatus.MODIFIED, problem)
            if needs_count:
                return func, Outcome(
                    EditStatus.MODIFIED,
                    "a hand-made embedding capture, but the collector's capture count does not include it",
                )
            return func, Outcome(EditStatus.HAND_APPLIED)
        func = insert_at(func, capture.anchor, canonical, after=False)
    if needs_count:
        assert capture.count is not None
        func = func.with_changes(body=func.body.visit(_WidenCount(capture.collector)))
    return func, Outcome(EditStatus.APPLIED)


def _legacy_blocks(module: cst.Module, site: EditSite, capture: Capture) -> set[str]:
    """The blocks an earlier patchcraft inserted here (``apply`` brings them up to date)."""
    return {
        strip_marker_lines(
            module, marked_statement(module, block(site, capture.collector, capture.expression, capture.method, flag))
        )
        for flag in LEGACY_FLAG_READS
    }


def judge_hand_fix(module: cst.Module, capture: Capture, hand: Sequence[cst.If]) -> Optional[str]:
    """Why a hand-made embedding capture does not do what patchcraft's block does, or None.

    It counts only where patchcraft's block would sit (after the collector,
    right before the capture loop, in the loop's branch, with nothing
    rebinding ``hidden_states`` in between) and when it appends a copy of
    the embedding output into the collector (or calls the release's own
    copying ``capture``). A block elsewhere captures another tensor: the
    seed's fix moved before ``return`` captures the last layer's output.
    """
    if len(hand) > 1:
        return f"line {line_of(module, hand[1])}: {len(hand)} hand-made embedding captures; one is expected"
    stmt = hand[0]
    where = f"line {line_of(module, stmt)}"
    position = next((i for i, s in enumerate(capture.statements) if s is stmt), None)
    anchor = (
        f"right before the capture loop (line {line_of(module, capture.anchor)}), after `{capture.collector} = ...`"
    )
    if position is None or position >= capture.index or not capture.precedes(position):
        return f"{where}: the hand-made embedding capture is misplaced: it captures another tensor; it belongs {anchor}"
    between = capture.statements[position + 1 : capture.index]
    if any(binds(s, "hidden_states") or binds(s, "residual") for s in between):
        return f"{where}: `hidden_states` changes between the hand-made capture and the loop: it belongs {anchor}"
    if stmt.orelse is not None or not isinstance(stmt.body, cst.IndentedBlock) or len(stmt.body.body) != 1:
        return f"{where}: the hand-made embedding capture should hold one `{capture.collector}.append(...)` and nothing else"
    if _normal(module, stmt.body.body[0]) not in _accepted_captures(capture):
        return (
            f"{where}: the hand-made embedding capture does not append a copy of the embedding output "
            f"(expected e.g. `{capture.collector}.append({NO_RESIDUAL_EXPRESSION})`"
            + (f" or `{capture.collector}.capture(hidden_states)`" if capture.method == "capture" else "")
            + "): an un-copied tensor is overwritten by layer 0's in-place residual add"
        )
    return None


def _accepted_captures(capture: Capture) -> set[str]:
    """Capture statements that append a copy of the embedding output (compared as ``ast`` dumps)."""
    name = capture.collector
    forms = [f"{name}.append({NO_RESIDUAL_EXPRESSION})", f"{name}.append(torch.clone(hidden_states))"]
    if capture.expression in (COPIED_SEED_EXPRESSION, COPIED_NO_RESIDUAL_EXPRESSION):
        forms += [f"{name}.append({capture.expression})"]  # the collector's append copies
    if capture.expression in (SEED_EXPRESSION, COPIED_SEED_EXPRESSION):
        forms += [
            f"{name}.append({SEED_EXPRESSION})",
            f"{name}.append(hidden_states + residual if residual is not None else hidden_states.clone())",
        ]
    if capture.method == "capture":
        forms.append(f"{name}.capture(hidden_states)")
    return {ast.dump(ast.parse(form)) for form in forms}


def _normal(module: cst.Module, stmt: cst.BaseStatement) -> str:
    try:
        return ast.dump(ast.parse(strip_marker_lines(module, stmt).strip()))
    except SyntaxError:
        return ""


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)
