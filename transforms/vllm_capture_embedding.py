"""vLLM: id 0 captures a copy of the embedding output, in a forward that captures at the top of each layer.

vLLM's id X means ``hs[X]`` (Hugging Face numbering). A forward whose layer
loop captures ``hidden_states + residual`` at the top of layer ``idx``
(DeepSeek's ``DeepseekV2Model.forward``, on every release that has the
setter) serves every id but 0: at layer 0 ``residual`` is still None and
the sum raises ``TypeError``. Two edits, found by structure:

- before the loop, right after the collector, a marked block appends a
  copy of ``hidden_states`` (the embedding output; layer 0 adds into that
  tensor in place) when 0 is asked for and ``residual`` is None (the first
  pipeline stage: later stages receive a residual);
- the loop's own capture test gets ``and residual is not None``, marked by
  a trailing ``# patchcraft:`` comment on its line, so layer 0 is not
  captured twice (nor crashes). :func:`revert` gives the test back.

The embedding output is found by structure, not by name: the stream the
loop threads through its layer call (``hidden_states, residual =
layer(positions, hidden_states, residual)``, or GPT-OSS's ``x, residual =
layer(x, positions, residual)`` on 0.11-0.17, whose capture ``x if residual
is None else x + residual`` feeds the embedding tensor itself at layer 0,
which that layer's fused add-norm then overwrites in place).

Ids without 0 capture exactly what they did: ``residual`` is None only
before layer 0 of the first stage.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    plain_code,
    replace_statement,
    strip_marker_lines,
    walk_statements,
)
from patchcraft.transforms._definite_assignment import bound_on_every_path

from patchcraft import MARKER
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.planning.records import EditSite

NAME = "vllm_capture_embedding"
KIND = EditKind.VLLM_FORWARD
DESCRIPTION = (
    "vLLM (id X is hs[X]): where the layer loop captures `hidden_states + residual` at the top of each layer "
    "(which raises at layer 0, where `residual` is None), append a copy of the embedding output right before "
    "the loop when id 0 is asked for on the first pipeline stage, and skip the loop's own capture while "
    "`residual` is None (a marked `and residual is not None` on its test)."
)
#: The comment of the block before the loop.
BLOCK_COMMENT = f"{MARKER} vLLM id 0 is hs[0], the embedding output: a copy (layer 0 adds into it in place), first pipeline stage only"
#: What the loop's capture test gets, and the trailing comment that marks it.
GUARD = "residual is not None"
GUARD_COMMENT = f"{MARKER} id 0 is captured before the loop"


def block(collector: str, ids: str, stream: str = "hidden_states") -> str:
    """The marked block inserted right before the layer loop; ``stream``: the embedding output's name."""
    return f"{BLOCK_COMMENT}\nif residual is None and 0 in {ids}:\n    {collector}.append({stream}.clone())\n"


@dataclass
class Capture:
    """The layer loop, its capture test and the collector it appends to."""

    loop: cst.For
    capture: cst.If
    ids: str  # the code of the ids the test reads (``self.aux_hidden_state_layers``)
    guarded: bool  # the test already ends in ``and residual is not None``
    collector: str
    statements: Sequence[cst.BaseStatement]  # the block holding the loop
    index: int  # the loop's position in it
    stream: str = "hidden_states"  # the name the loop threads through its layer call: the embedding output


def _guarded(test: cst.BaseExpression) -> bool:
    return (
        isinstance(test, cst.BooleanOperation)
        and isinstance(test.operator, cst.And)
        and plain_code(test.right) == GUARD
    )


def _membership(test: cst.BaseExpression) -> Optional[tuple[str, str]]:
    """``NAME in EXPR`` (or that ``and residual is not None``) -> (NAME, code of EXPR)."""
    if _guarded(test):
        test = test.left  # type: ignore[attr-defined]
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name)):
        return None
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.In):
        return None
    return test.left.value, plain_code(target.comparator)


def _loop_names(loop: cst.For) -> set[str]:
    return {n.value for n in iter_nodes(loop.target) if isinstance(n, cst.Name)}


def _reads(node: cst.CSTNode, name: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == name for n in iter_nodes(node))


def _appended_to(node: cst.CSTNode) -> set[str]:
    return {
        n.value.value
        for n in iter_nodes(node)
        if isinstance(n, cst.Attribute) and n.attr.value == "append" and isinstance(n.value, cst.Name)
    }


def _collector_of(stmt: cst.BaseStatement) -> Optional[str]:
    """``NAME = []`` (optionally annotated) -> NAME."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target, value = small.targets[0].target, small.value
    elif isinstance(small, cst.AnnAssign) and small.value is not None:
        target, value = small.target, small.value
    else:
        return None
    if isinstance(target, cst.Name) and isinstance(value, cst.List) and not value.elements:
        return target.value
    return None


def _names(node: cst.BaseExpression) -> list[str]:
    """The names an assignment target binds: ``x`` or ``x, residual``."""
    if isinstance(node, cst.Name):
        return [node.value]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [e.value.value for e in node.elements if isinstance(e.value, cst.Name)]
    return []


def _threaded(loop: cst.For) -> list[str]:
    """The streams the loop threads: a name its body passes to a call and binds from that call's result
    (``hidden_states, residual = layer(positions, hidden_states, residual)``; ``x, residual = layer(x, ...)``),
    ``residual`` aside."""
    found: list[str] = []
    for stmt in loop.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if not (isinstance(small, cst.Assign) and isinstance(small.value, cst.Call)):
                continue
            bound = {n for t in small.targets for n in _names(t.target)}
            passed = [a.value.value for a in small.value.args if isinstance(a.value, cst.Name)]
            found += [n for n in passed if n in bound and n != "residual" and n not in found]
    return found


def _stream(loop: cst.For, capture: cst.If) -> Optional[str]:
    """The embedding output's name: the one stream the loop threads that its capture reads (else None)."""
    read = [n for n in _threaded(loop) if _reads(capture.body, n)]
    return read[0] if len(read) == 1 else None


EXPECTED_LOOP = (
    "a layer loop (`for idx, layer in ...:`) whose capture `if idx in self.aux_hidden_state_layers:` "
    "reads `hidden_states + residual` (vLLM's top-of-layer capture)"
)


def analyse(func: cst.FunctionDef, site: EditSite) -> Capture:
    """Find the capture loop, its test and the collector; refuse any other shape, saying what was expected."""
    walked = walk_statements(func)
    found = []
    for stmt, chain in walked:
        if not (isinstance(stmt, cst.If) and len(chain) >= 2):
            continue
        owner_block, owner_index = chain[-2]
        owner = owner_block.body[owner_index]
        membership = _membership(stmt.test)
        if isinstance(owner, cst.For) and membership and membership[0] in _loop_names(owner):
            found.append((stmt, owner, chain[:-1], membership[1]))
    if not found:
        raise AnchorError(site, EXPECTED_LOOP)
    if len(found) > 1:
        lines = ", ".join(str(line_of_stmt(func, f[0])) for f in found)
        raise AnchorError(site, f"one capture test in the layer loop, found {len(found)} ({lines}); ambiguous")
    capture, loop, loop_chain, ids = found[0]
    if not _reads(capture.body, "residual"):
        raise AnchorError(site, EXPECTED_LOOP + "; the capture `if` reads no `residual`: id 0 needs no edit here")
    collectors = _appended_to(capture.body)
    if len(collectors) != 1:
        raise AnchorError(site, f"the capture `if` to append to one list, found {len(collectors) or 'none'}")
    collector = next(iter(collectors))
    block_node, index = loop_chain[-1]
    statements = list(block_node.body)
    if not any(_collector_of(s) == collector for s in statements[:index]):
        raise AnchorError(site, f"`{collector} = []` before the layer loop, in the same block")
    stream = _stream(loop, capture)
    if stream is None:
        if not _reads(capture.body, "hidden_states"):
            raise AnchorError(
                site,
                "the layer loop to thread one stream its capture reads "
                "(`x, residual = layer(x, ..., residual)`, the capture reading `x`): the embedding output",
            )
        stream = "hidden_states"  # a layer call the loop does not rebind from directly (``layer_outputs[0]``)
    point = loop_chain
    for name in (stream, "residual"):
        if not bound_on_every_path(func, point, name):
            raise AnchorError(site, f"`{name}` bound on every path before the layer loop (the embedding output)")
    return Capture(loop, capture, ids, _guarded(capture.test), collector, statements, index, stream)


def line_of_stmt(func: cst.FunctionDef, stmt: cst.CSTNode) -> str:
    return plain_code(stmt).strip().splitlines()[0]


def _guard_marked(capture: cst.If) -> bool:
    body = capture.body
    return (
        isinstance(body, cst.IndentedBlock)
        and body.header.comment is not None
        and body.header.comment.value.startswith(MARKER)
    )


def _with_guard(module: cst.Module, capture: cst.If, site: EditSite) -> cst.If:
    body = capture.body
    assert isinstance(body, cst.IndentedBlock)
    if body.header.comment is not None or body.header.whitespace.value:
        raise AnchorError(
            site,
            f"the capture test's line (line {line_of(module, capture)}) to end at its colon, "
            "with no comment: patchcraft marks its guard there",
        )
    test = cst.BooleanOperation(left=capture.test, operator=cst.And(), right=cst.parse_expression(GUARD))
    header = body.header.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(GUARD_COMMENT))
    return capture.with_changes(test=test, body=body.with_changes(header=header))


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    capture = analyse(func, site)
    canonical = marked_statement(module, block(capture.collector, capture.ids, capture.stream))
    before = capture.statements[capture.index - 1]
    marked = [s for s, _ in walk_statements(func) if is_marked(s)]
    if capture.guarded and not _guard_marked(capture.capture):
        return func, Outcome(
            EditStatus.MODIFIED,
            f"line {line_of(module, capture.capture)}: a hand-made `and {GUARD}` on the capture test; "
            "remove it (patchcraft makes this edit, marked)",
        )
    block_present = False
    for stmt in marked:
        if stmt is before and strip_marker_lines(module, stmt) == strip_marker_lines(module, canonical):
            block_present = True
        else:
            return func, Outcome(
                EditStatus.MODIFIED,
                f"line {line_of(module, stmt)}: the inserted capture block was changed or moved by hand",
            )
    hand = [
        s
        for s in capture.statements[: capture.index]
        if isinstance(s, cst.If)
        and not is_marked(s)
        and capture.collector in _appended_to(s)
        and _reads(s.test, "residual")
    ]
    if hand:
        return func, Outcome(
            EditStatus.MODIFIED,
            f"line {line_of(module, hand[0])}: a hand-made capture before the layer loop; "
            "remove it (patchcraft makes this edit, marked)",
        )
    if block_present and capture.guarded:
        return func, Outcome(EditStatus.PRESENT)
    if not capture.guarded:
        func = replace_statement(func, capture.capture, _with_guard(module, capture.capture, site))
        capture = analyse(func, site)
    if not block_present:
        func = insert_at(func, capture.loop, canonical, after=False)
    return func, Outcome(EditStatus.APPLIED)


class _RevertGuard(cst.CSTTransformer):
    """``if X and residual is not None:  # patchcraft: ...`` -> ``if X:``, as it was."""

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        if not (_guard_marked(updated) and _guarded(updated.test)):
            return updated
        body = updated.body
        assert isinstance(body, cst.IndentedBlock)
        header = body.header.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)
        return updated.with_changes(test=updated.test.left, body=body.with_changes(header=header))  # type: ignore[attr-defined]


def revert(module: cst.Module) -> cst.Module:
    """Give the capture test back its own words (the marked block goes with every marked statement)."""
    return module.visit(_RevertGuard())


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)
