"""Edit 4 (all-reduce fusion, per layer): the setter marks the layers whose output a capture reads.

Only in models whose EAGLE-3 capture reads ``hidden_states + residual``
before the next layer's norm completes a deferred all-reduce
(:mod:`patchcraft.reading.fusion_reading`). At the end of the setter, once
``layers_to_capture`` holds its final ids, every decoder layer's
communicator gets a marked attribute: True for layer ``i - 1`` of each
capture at the top of layer ``i``, False for every other layer::

    # patchcraft: all-reduce fusion: a capture at the top of layer i reads layer i-1's output; mark those layers
    for _index, _layer in enumerate(getattr(self.model, "layers", ())):
        if hasattr(_layer, "layer_communicator"):
            _layer.layer_communicator.patchcraft_output_captured = _index + 1 in self.model.layers_to_capture

The fusion edit (``keep_captured_states_reduced``) reads that attribute in
``should_fuse_mlp_allreduce_with_next_layer``, so only the marked layers of
those models lose the fused all-reduce. The loop runs each time the setter
does (the runner edit calls it with the configured ids before graph
capture), so a later call with other ids moves the marks. Layers of another
pipeline stage (no communicator) are skipped; a setter that returns early on
a stage (``if not self.pp_group.is_last_rank: return``) sets no ids there,
so there is nothing to mark.
"""

from __future__ import annotations

import libcst as cst

from patchcraft.reading.fusion_reading import MARK, MarkParams
from patchcraft.planning.records import EditSite
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.transforms._base import (
    AnchorError,
    Outcome,
    body_of,
    edit_method,
    insert_at,
    is_marked,
    line_of,
    marked_statement,
    plain_code,
    strip_marker_lines,
)

NAME = "mark_captured_outputs"
KIND = EditKind.FUSION_MARK
DESCRIPTION = (
    "At the end of set_eagle3_layers_to_capture, in models whose capture reads hidden_states + residual before a "
    "deferred all-reduce, mark the communicator of each layer whose output a capture reads, so the fusion guard "
    "keeps only those layers' outputs reduced."
)
#: The comment that starts the inserted loop (and tells it from the setter's own marked block).
COMMENT = "# patchcraft: all-reduce fusion: a capture at the top of layer i reads layer i-1's output; mark those layers"


def code(site: EditSite) -> str:
    params = site.params_as(MarkParams)
    target, comm = params.target, params.communicator
    return (
        f"{COMMENT}\n"
        f'for _index, _layer in enumerate(getattr({target}, "layers", ())):\n'
        f'    if hasattr(_layer, "{comm}"):\n'
        f"        _layer.{comm}.{MARK} = _index + 1 in {target}.layers_to_capture\n"
    )


def is_mark(stmt: cst.CSTNode) -> bool:
    """Whether ``stmt`` is this edit's loop (the setter's own marked block is not)."""
    lines = getattr(stmt, "leading_lines", ())
    return any(line.comment is not None and line.comment.value == COMMENT for line in lines)


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    canonical = marked_statement(module, code(site))
    body = list(body_of(func))
    ours = [s for s in body if is_mark(s)]
    if ours:
        if strip_marker_lines(module, ours[0]) == strip_marker_lines(module, canonical):
            return func, Outcome(EditStatus.PRESENT)
        return func, Outcome(
            EditStatus.MODIFIED, f"line {line_of(module, ours[0])}: the layer marking loop was changed by hand"
        )
    if f".{MARK}" in plain_code(func):
        return func, Outcome(EditStatus.HAND_APPLIED)
    if not body:
        raise AnchorError(site, "an indented setter body")
    # A bare early ``return`` (``if not self.pp_group.is_last_rank: return``) leaves the ids unset on
    # that stage, so there is nothing to mark; a return with a value is no setter shape we know.
    if any(isinstance(n, cst.Return) and n.value is not None for n in _walk(func)):
        raise AnchorError(site, "a setter whose every `return` is bare (the marks go after its last statement)")
    last = body[-1]
    return insert_at(func, last, canonical, after=True), Outcome(EditStatus.APPLIED)


def _walk(node: cst.CSTNode):
    """Every node under ``node`` (nested defs too: a conservative test for ``return``)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    """Append the marking loop to the setter (idempotent; marked, so revert removes it)."""
    return edit_method(module, site, edit)
