"""vLLM: the capture of ``EagleModelMixin`` (0.18 on) makes id 0 a copy of the embedding output.

From vLLM 0.18 most models (Llama, Qwen2/3, GPT-OSS and ~25 files more)
capture their aux hidden states through one method,
``EagleModelMixin._maybe_add_hidden_state`` (``interfaces.py``), called
before the layer loop with ``layer_idx`` 0 and after each layer with
``idx + 1``::

    if layer_idx in self.aux_hidden_state_layers:
        value = hidden_states + residual if residual is not None else hidden_states
        aux_hidden_states.append(value)

Before layer 0 ``residual`` is None, so id 0 appends the embedding tensor
*itself*; layer 0 takes that tensor as its residual and its fused add-norm
adds into it in place, so after the forward the draft reads the last
pre-norm stream instead of ``hs[0]``. One marked block at the top of the
capture's ``if`` makes that one entry a copy::

    # patchcraft: ...
    if layer_idx == 0 and residual is None:
        hidden_states = hidden_states.clone()

It rebinds the method's own parameter: the caller's tensor goes on to
layer 0 unchanged, only the captured entry is a copy. Ids without 0 (and
id 0 on a later pipeline stage, which receives a residual) capture exactly
the tensors they did. Purely an insertion: ``revert`` removes the marked
block and gives the method back byte for byte.
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
    is_marked,
    iter_nodes,
    line_of,
    marked_statement,
    replace_statement,
    strip_marker_lines,
    walk_statements,
)

from patchcraft import MARKER
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.planning.records import EditSite

NAME = "vllm_copy_mixin_embedding"
KIND = EditKind.VLLM_MIXIN
DESCRIPTION = (
    "vLLM 0.18+ (id X is hs[X]): in `EagleModelMixin._maybe_add_hidden_state`, the one capture every mixin "
    "model calls, id 0 (`layer_idx == 0`, `residual` None) appends the embedding tensor itself, which layer 0 "
    "takes as its residual and its fused add-norm overwrites in place; a marked block at the top of the "
    "capture's `if` rebinds `hidden_states` to a copy there, so the draft gets hs[0] and every other id the "
    "tensor it got before."
)
#: The comment of the inserted block.
BLOCK_COMMENT = (
    f"{MARKER} vLLM id 0 is hs[0]: capture a copy, not the embedding tensor itself "
    "(layer 0 takes it as its residual and its fused add-norm adds into it in place)"
)
HIDDEN = "hidden_states"
RESIDUAL = "residual"

EXPECTED = (
    "the mixin's capture: a method taking `hidden_states` and `residual` whose one "
    "`if <layer index> in <ids>:` appends `hidden_states` (plus `residual` when it is not None) to a list"
)


def block(index: str) -> str:
    """The marked block inserted at the top of the capture's ``if``."""
    return f"{BLOCK_COMMENT}\nif {index} == 0 and {RESIDUAL} is None:\n    {HIDDEN} = {HIDDEN}.clone()\n"


@dataclass
class Capture:
    """The capture ``if`` and the name of the layer index it tests."""

    capture: cst.If
    index: str
    body: Sequence[cst.BaseStatement]


def _parameters(func: cst.FunctionDef) -> list[str]:
    params = func.params
    return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]


def _membership(test: cst.BaseExpression) -> Optional[str]:
    """``NAME in EXPR`` -> NAME."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name)):
        return None
    return test.left.value if isinstance(test.comparisons[0].operator, cst.In) else None


def _reads(node: cst.CSTNode, name: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == name for n in iter_nodes(node))


def _appends(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Attribute) and n.attr.value == "append" for n in iter_nodes(node))


def _clones(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Attribute) and n.attr.value == "clone" for n in iter_nodes(node))


def analyse(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> Capture:
    """Find the capture ``if``; refuse any other shape, naming the method's line and what was expected."""
    where = f"(line {line_of(module, func)}) "
    params = _parameters(func)
    missing = [name for name in (HIDDEN, RESIDUAL) if name not in params]
    if missing:
        raise AnchorError(site, f"{EXPECTED}; {where}takes no `{'`, `'.join(missing)}`")
    found = [
        (stmt, _membership(stmt.test))
        for stmt, _ in walk_statements(func)
        if isinstance(stmt, cst.If) and _membership(stmt.test) in params
    ]
    if not found:
        raise AnchorError(site, f"{EXPECTED}; {where}has no `if <parameter> in <ids>:`")
    if len(found) > 1:
        lines = ", ".join(str(line_of(module, stmt)) for stmt, _ in found)
        raise AnchorError(site, f"{EXPECTED}; found {len(found)} such tests (lines {lines}): ambiguous")
    capture, index = found[0]
    assert index is not None
    body = capture.body
    if not isinstance(body, cst.IndentedBlock):
        raise AnchorError(site, f"{EXPECTED}; the test at line {line_of(module, capture)} has its body on its line")
    if not (_appends(body) and _reads(body, HIDDEN)):
        raise AnchorError(
            site, f"{EXPECTED}; the `if` at line {line_of(module, capture)} appends no `{HIDDEN}` to a list"
        )
    return Capture(capture, index, body.body)


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    found = analyse(module, func, site)
    canonical = marked_statement(module, block(found.index))
    first = found.body[0]
    for stmt, _ in walk_statements(func):
        if is_marked(stmt) and stmt is not first:
            return func, Outcome(
                EditStatus.MODIFIED, f"line {line_of(module, stmt)}: the inserted copy was moved or changed by hand"
            )
    if is_marked(first):
        if strip_marker_lines(module, first) == strip_marker_lines(module, canonical):
            return func, Outcome(EditStatus.PRESENT)
        return func, Outcome(
            EditStatus.MODIFIED, f"line {line_of(module, first)}: the inserted copy was changed by hand"
        )
    if _clones(found.capture.body):
        return func, Outcome(
            EditStatus.MODIFIED,
            f"line {line_of(module, found.capture)}: the capture copies already (a hand-made `.clone()`); "
            "remove it (patchcraft makes this edit, marked)",
        )
    body = found.capture.body
    assert isinstance(body, cst.IndentedBlock)
    patched = found.capture.with_changes(body=body.with_changes(body=(canonical, *body.body)))
    return replace_statement(func, found.capture, patched), Outcome(EditStatus.APPLIED)


def revert(module: cst.Module) -> cst.Module:
    """Nothing in place: the marked block goes with every marked statement."""
    return module


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)
