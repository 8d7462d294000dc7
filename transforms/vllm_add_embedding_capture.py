"""vLLM: a forward that captures only after each layer gets id 0's capture, the embedding streams' mean, before its loop.

DeepSeek-V4 (``vllm/models/deepseek_v4/<platform>/model.py``, 0.26 on, every
platform) captures the completed hyper-connection streams after each layer,
averaged over the streams::

    for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
        hidden_states, residual, post_mix, res_mix = layer(hidden_states, positions, input_ids, ...)
        if (idx + 1) in self.aux_hidden_state_layers:
            aux_recon = layer.hc_post(hidden_states, residual, post_mix, res_mix)   # the stream completed
            aux_hidden_states.append(aux_recon.mean(dim=1))

Id X is ``hs[X]`` for X from 1, and id 0 is never captured: the draft gets
one state fewer than it has ids, and its ``fc`` fails on the width. One
marked block right before the loop captures id 0 the same way, from the
stream the loop starts with (the embedding output, widened to the streams
on CPU, ROCm and XPU; still ``[tokens, hidden]`` on NVIDIA, whose first
layer widens it)::

    # patchcraft: ...
    if self.start_layer == 0 and 0 in self.aux_hidden_state_layers:
        aux_hidden_states.append(hidden_states.clone() if hidden_states.dim() == 2 else hidden_states.mean(dim=1))

The statements of the loop's capture from its ``.mean(dim=1)`` on come
along (0.34's NVIDIA module gathers a sequence-parallel shard before it
appends); a statement that reads what the capture computed before the mean
(``final_aux_recon = aux_recon``) does not. The guard is the loop's own
first layer (``enumerate``'s ``start``): a later pipeline stage, which
receives a stream rather than the embedding, captures nothing more. The
mean is a new tensor and a 2-D embedding is cloned, so no layer can add
into the entry. Ids without 0 capture exactly what they did. Purely an
insertion: ``revert`` removes the marked block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst
from patchcraft.transforms._base import (
    AnchorError,
    Outcome,
    edit_method,
    insert_at,
    is_marked,
    iter_nodes,
    line_of,
    marked_statement,
    strip_marker_lines,
    walk_statements,
)

from patchcraft import MARKER
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.planning.records import EditSite

NAME = "vllm_add_embedding_capture"
KIND = EditKind.VLLM_ADD_CAPTURE
DESCRIPTION = (
    "vLLM (id X is hs[X]): where a forward captures only after each layer (`if idx + 1 in "
    "self.aux_hidden_state_layers:`, the hyper-connection streams' `.mean(dim=1)`: DeepSeek-V4), id 0 captures "
    "nothing; a marked block before the loop captures it the same way from the stream the loop starts with (the "
    "embedding output), on the first pipeline stage only."
)
#: The comment of the inserted block.
BLOCK_COMMENT = (
    f"{MARKER} vLLM id 0 is hs[0]: this forward captures after each layer only, so id 0 captured nothing; "
    "capture it before the first layer as the loop captures the others (the embedding streams' mean, a new tensor)"
)
IDS_ATTR = "aux_hidden_state_layers"
MEAN = "mean"

EXPECTED = (
    "a layer loop capturing after each layer: `for <idx>, <layer> in enumerate(..., start=<first layer>)` whose "
    "body calls the decoder layer, rebinding the stream it passes first, then `if <idx> + 1 in "
    "self.aux_hidden_state_layers:` holding one `.mean(dim=1)` that reaches `<list>.append(...)`"
)


@dataclass
class Site:
    """What the block is made of: the loop, its first layer, the stream, the ids and the capture's statements."""

    loop: cst.For
    start: str
    stream: str
    ids: str
    statements: list[cst.BaseStatement]


def _loop_names(loop: cst.For) -> list[str]:
    """The loop's targets in order: ``idx, layer``."""
    target = loop.target
    if isinstance(target, (cst.Tuple, cst.List)):
        return [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
    return [target.value] if isinstance(target, cst.Name) else []


def _layer_call_stream(loop: cst.For) -> Optional[str]:
    """The stream the loop's layer call passes first and rebinds: ``hidden_states, ... = layer(hidden_states, ...)``."""
    names = set(_loop_names(loop)[1:])
    for stmt in loop.body.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)):
            continue
        assign = stmt.body[0]
        call = assign.value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in names):
            continue
        bound = {n.value for t in assign.targets for n in iter_nodes(t.target) if isinstance(n, cst.Name)}
        first = next((a.value for a in call.args if a.keyword is None and isinstance(a.value, cst.Name)), None)
        if first is not None and first.value in bound:
            return first.value
    return None


def _start(loop: cst.For) -> Optional[cst.BaseExpression]:
    """``enumerate(..., start=S)``'s ``S``: the loop's first layer."""
    it = loop.iter
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "enumerate":
        for arg in it.args:
            if arg.keyword is not None and arg.keyword.value == "start":
                return arg.value
    return None


def _after_layer_test(test: cst.BaseExpression, index: str) -> Optional[cst.BaseExpression]:
    """``(<index> + 1) in <...>.aux_hidden_state_layers`` -> the ids expression."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return None
    target = test.comparisons[0]
    comparator, left = target.comparator, test.left
    if not (
        isinstance(target.operator, cst.In)
        and isinstance(comparator, cst.Attribute)
        and comparator.attr.value == IDS_ATTR
    ):
        return None
    if (
        isinstance(left, cst.BinaryOperation)
        and isinstance(left.operator, cst.Add)
        and isinstance(left.left, cst.Name)
        and left.left.value == index
        and isinstance(left.right, cst.Integer)
        and left.right.value == "1"
    ):
        return comparator
    return None


def _is_mean(node: cst.CSTNode) -> bool:
    """``<X>.mean(dim=1)``: the streams averaged."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == MEAN
        and len(node.args) == 1
        and node.args[0].keyword is not None
        and node.args[0].keyword.value == "dim"
        and isinstance(node.args[0].value, cst.Integer)
        and node.args[0].value.value == "1"
    )


def _appends(stmts: list) -> bool:
    return any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "append"
        for s in stmts
        for n in iter_nodes(s)
    )


def _reads(stmt: cst.CSTNode, names: set[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in names for n in iter_nodes(stmt))


def _bound(stmt: cst.CSTNode) -> set[str]:
    found: set[str] = set()
    for node in iter_nodes(stmt):
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            found |= {n.value for t in targets for n in iter_nodes(t) if isinstance(n, cst.Name)}
    return found


class _Replace(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.BaseExpression) -> None:
        self.old, self.new = old, new

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        return self.new if original is self.old else updated


def analyse(func: cst.FunctionDef, site: EditSite) -> Site:
    """The loop capturing after each layer and what the block is made of; refuse any other shape, naming it."""
    candidates = []
    for stmt, _ in walk_statements(func):
        if not isinstance(stmt, cst.For) or not isinstance(stmt.body, cst.IndentedBlock):
            continue
        names = _loop_names(stmt)
        stream = _layer_call_stream(stmt)
        if len(names) != 2 or stream is None:
            continue
        for inner in stmt.body.body:
            if isinstance(inner, cst.If):
                ids = _after_layer_test(inner.test, names[0])
                if ids is not None:
                    candidates.append((stmt, stream, ids, inner))
    if not candidates:
        raise AnchorError(site, f"{EXPECTED}; found no loop capturing `<idx> + 1`")
    if len(candidates) > 1:
        raise AnchorError(site, f"{EXPECTED}; found {len(candidates)} such captures: ambiguous")
    loop, stream, ids, capture = candidates[0]
    start = _start(loop)
    if start is None:
        raise AnchorError(site, f"{EXPECTED}; the loop has no `enumerate(..., start=...)` naming its first layer")
    body = list(capture.body.body)
    means = [(i, n) for i, s in enumerate(body) for n in iter_nodes(s) if _is_mean(n)]
    if len(means) != 1:
        raise AnchorError(site, f"{EXPECTED}; the capture holds {len(means)} `.mean(dim=1)`, not one")
    index, mean = means[0]
    before = set().union(*(_bound(s) for s in body[:index])) if index else set()
    value = cst.parse_expression(f"{stream}.clone() if {stream}.dim() == 2 else {stream}.{MEAN}(dim=1)")
    first = body[index].visit(_Replace(mean, value))
    assert isinstance(first, cst.BaseStatement)
    kept = [first, *(s for s in body[index + 1 :] if not _reads(s, before - _bound(first)))]
    if not _appends(kept):
        raise AnchorError(site, f"{EXPECTED}; nothing after the `.mean(dim=1)` appends it")
    module = cst.Module(body=[])
    return Site(loop, module.code_for_node(start), stream, module.code_for_node(ids), kept)  # type: ignore[arg-type]


def block(module: cst.Module, found: Site) -> str:
    """The marked block inserted right before the loop."""
    indent = module.default_indent
    lines = []
    for stmt in found.statements:
        code = module.code_for_node(stmt.with_changes(leading_lines=()))
        lines += [indent + line if line.strip() else line for line in code.rstrip("\n").split("\n")]
    inner = "\n".join(lines)
    return f"{BLOCK_COMMENT}\nif {found.start} == 0 and 0 in {found.ids}:\n{inner}\n"


def _previous(func: cst.FunctionDef, loop: cst.For) -> Optional[cst.BaseStatement]:
    for stmt, chain in walk_statements(func):
        if stmt is loop:
            block_, index = chain[-1]
            return block_.body[index - 1] if index else None
    return None


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    found = analyse(func, site)
    canonical = marked_statement(module, block(module, found))
    previous = _previous(func, found.loop)
    ours = previous if previous is not None and is_marked(previous) else None
    for stmt, _ in walk_statements(func):
        if is_marked(stmt) and stmt is not ours:
            return func, Outcome(
                EditStatus.MODIFIED, f"line {line_of(module, stmt)}: the inserted capture was moved by hand"
            )
    if ours is not None:
        if strip_marker_lines(module, ours) != strip_marker_lines(module, canonical):
            return func, Outcome(
                EditStatus.MODIFIED, f"line {line_of(module, ours)}: the inserted capture was changed by hand"
            )
        return func, Outcome(EditStatus.PRESENT)
    if isinstance(previous, cst.If) and any(
        isinstance(n, cst.Attribute) and n.attr.value == IDS_ATTR for n in iter_nodes(previous.test)
    ):
        return func, Outcome(
            EditStatus.MODIFIED,
            f"line {line_of(module, previous)}: a capture right before the loop exists already (made by hand?); "
            "remove it (patchcraft makes this edit, marked)",
        )
    return insert_at(func, found.loop, canonical, after=False), Outcome(EditStatus.APPLIED)


def revert(module: cst.Module) -> cst.Module:
    """Nothing in place: the marked block goes with every marked statement."""
    return module


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)
