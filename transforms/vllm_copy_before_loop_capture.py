"""vLLM: a capture before the layer loop appends a copy of the embedding output, not the tensor itself.

Some vLLM forwards capture id 0 before their layer loop, guarded by the
first layer's index (0.33-0.34's ``KimiLinearModel.forward`` in
``vllm/models/kimi_k3/nvidia/model.py``, 0.27-0.32's
``Cohere2MoeModel.forward``)::

    aux_hidden_states: list[torch.Tensor] = []
    if get_pp_group().is_first_rank and self.start_layer in self.aux_hidden_state_layers:
        if self.use_attn_res or residual is None:
            aux_hidden_states.append(hidden_states)
        else:
            aux_hidden_states.append(hidden_states + residual)
    for layer_idx, layer in enumerate(...):
        hidden_states, prefix_sum, residual = layer(...)

The entry appended by name is the embedding tensor itself; layer 0 takes
it as its residual and vLLM's fused add-norm adds into it in place, so
after the forward the draft reads the last pre-norm stream instead of
``hs[0]``. Right after each such append (a bare name appended, in the
capture ``if`` that sits before the layer loop, in the loop's own block)
one marked statement makes the entry just appended a copy::

    aux_hidden_states.append(hidden_states)
    # patchcraft: ...
    aux_hidden_states[-1] = aux_hidden_states[-1].clone()

The stream the loop goes on with is untouched (layer 0 still adds into the
embedding tensor, as before); only the captured entry is a copy, holding
what it held when it was captured. An entry appended as an expression
(``hidden_states + residual``, a later pipeline stage) is a new tensor
already and is left alone, and so is every capture in or after the loop.
Purely an insertion: ``revert`` removes the marked statements and gives
the method back byte for byte.
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
    plain_code,
    strip_marker_lines,
    walk_statements,
)

from patchcraft import MARKER
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.planning.records import EditSite

NAME = "vllm_copy_before_loop_capture"
KIND = EditKind.VLLM_BEFORE_LOOP
DESCRIPTION = (
    "vLLM (id X is hs[X]): where a forward captures id 0 before its layer loop by appending the embedding "
    "tensor itself (`aux_hidden_states.append(hidden_states)` under `if self.start_layer in "
    "self.aux_hidden_state_layers:`), which layer 0 takes as its residual and its fused add-norm overwrites in "
    "place, a marked statement right after that append makes the entry a copy "
    "(`aux_hidden_states[-1] = aux_hidden_states[-1].clone()`); the stream and every other capture are untouched."
)
#: The comment of the inserted statement.
BLOCK_COMMENT = (
    f"{MARKER} vLLM id 0 is hs[0]: the entry just captured a copy, not the embedding tensor itself "
    "(layer 0 takes it as its residual and its fused add-norm adds into it in place)"
)
IDS_ATTR = "aux_hidden_state_layers"

EXPECTED = (
    "a capture before the layer loop: an `if <first layer> in self.aux_hidden_state_layers:`, in the block of the "
    "loop that calls the decoder layers and before it, appending a name (the embedding tensor) to a list"
)


def statement(collector: str) -> str:
    """The marked statement inserted right after ``collector.append(NAME)``."""
    return f"{BLOCK_COMMENT}\n{collector}[-1] = {collector}[-1].clone()\n"


@dataclass
class Append:
    """One ``collector.append(NAME)`` statement of the capture, the statement after it in its block (if any)."""

    stmt: cst.SimpleStatementLine
    collector: str
    following: Optional[cst.BaseStatement]


def _ids_test(test: cst.BaseExpression) -> bool:
    """``X in <...>.aux_hidden_state_layers`` anywhere in the test (``A and X in self.aux_hidden_state_layers``)."""
    for node in iter_nodes(test):
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            target = node.comparisons[0]
            comparator = target.comparator
            if (
                isinstance(target.operator, cst.In)
                and isinstance(comparator, cst.Attribute)
                and comparator.attr.value == IDS_ATTR
            ):
                return True
    return False


def _loop_names(loop: cst.For) -> set[str]:
    return {n.value for n in iter_nodes(loop.target) if isinstance(n, cst.Name)}


def _calls_layers(loop: cst.For) -> bool:
    """A loop over the decoder layers: its body calls its loop variable (``layer(...)``) or ``self.layers[...]``."""
    names = _loop_names(loop)
    for node in iter_nodes(loop.body):
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Name) and func.value in names:
                return True
            if isinstance(func, cst.Subscript) and isinstance(func.value, cst.Attribute):
                if func.value.attr.value == "layers":
                    return True
    return False


def _append_of_name(stmt: cst.BaseStatement) -> Optional[str]:
    """``C.append(NAME)`` alone on its line -> ``C``."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    expr = stmt.body[0]
    if not isinstance(expr, cst.Expr) or not isinstance(expr.value, cst.Call):
        return None
    call = expr.value
    func = call.func
    if not (
        isinstance(func, cst.Attribute)
        and func.attr.value == "append"
        and isinstance(func.value, cst.Name)
        and len(call.args) == 1
        and call.args[0].keyword is None
        and call.args[0].star == ""
        and isinstance(call.args[0].value, cst.Name)
    ):
        return None
    return func.value.value


def _appends(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Attribute) and n.attr.value == "append" for n in iter_nodes(node))


def _capture_if(func: cst.FunctionDef, site: EditSite) -> cst.If:
    """The one capture ``if`` before the layer loop, in the loop's block."""
    walked = walk_statements(func)
    loops = [(stmt, chain) for stmt, chain in walked if isinstance(stmt, cst.For) and _calls_layers(stmt)]
    if not loops:
        raise AnchorError(site, f"{EXPECTED}; found no loop calling the decoder layers")
    _, chain = loops[0]
    block, index = chain[-1]
    found = [s for s in block.body[:index] if isinstance(s, cst.If) and _ids_test(s.test) and _appends(s.body)]
    if not found:
        raise AnchorError(site, f"{EXPECTED}; nothing is captured before the loop")
    if len(found) > 1:
        raise AnchorError(site, f"{EXPECTED}; found {len(found)} such captures before the loop: ambiguous")
    return found[0]


def analyse(func: cst.FunctionDef, site: EditSite) -> list[Append]:
    """Each ``C.append(NAME)`` of the capture before the loop, with the statement after it; refuse other shapes."""
    capture = _capture_if(func, site)
    appends: list[Append] = []
    for stmt, chain in walk_statements(func):
        if not any(b.body[i] is capture for b, i in chain[:-1]):
            continue
        collector = _append_of_name(stmt)
        if collector is None:
            continue
        block, index = chain[-1]
        following = block.body[index + 1] if index + 1 < len(block.body) else None
        appends.append(Append(stmt, collector, following))
    if not appends:
        raise AnchorError(site, f"{EXPECTED}; the capture appends no name (nothing to copy)")
    return appends


def _copies(stmt: Optional[cst.BaseStatement], collector: str) -> bool:
    """``C[-1] = C[-1].clone()`` (marked or not)."""
    if stmt is None or not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return plain_code(stmt.with_changes(leading_lines=())).strip() == f"{collector}[-1] = {collector}[-1].clone()"


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    appends = analyse(func, site)
    canonical = {a.collector: marked_statement(module, statement(a.collector)) for a in appends}
    ours = {id(a.following) for a in appends if a.following is not None and is_marked(a.following)}
    for stmt, _ in walk_statements(func):
        if is_marked(stmt) and id(stmt) not in ours:
            return func, Outcome(
                EditStatus.MODIFIED, f"line {line_of(module, stmt)}: the inserted copy was moved by hand"
            )
    missing: list[Append] = []
    for append in appends:
        following = append.following
        if following is not None and is_marked(following):
            if strip_marker_lines(module, following) != strip_marker_lines(module, canonical[append.collector]):
                return func, Outcome(
                    EditStatus.MODIFIED, f"line {line_of(module, following)}: the inserted copy was changed by hand"
                )
        elif _copies(following, append.collector):
            return func, Outcome(
                EditStatus.MODIFIED,
                f"line {line_of(module, append.stmt)}: the capture copies already (a hand-made `.clone()`); "
                "remove it (patchcraft makes this edit, marked)",
            )
        else:
            missing.append(append)
    if not missing:
        return func, Outcome(EditStatus.PRESENT)
    for _ in missing:  # one at a time, each found again in the method as it now is
        append = next(a for a in analyse(func, site) if a.following is None or not is_marked(a.following))
        func = insert_at(func, append.stmt, marked_statement(module, statement(append.collector)), after=True)
    return func, Outcome(EditStatus.APPLIED)


def revert(module: cst.Module) -> cst.Module:
    """Nothing in place: the marked statements go with every marked statement."""
    return module


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)
