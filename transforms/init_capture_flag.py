"""Edit 1: initialise the embedding-capture flag in the inner model's ``__init__``."""

from __future__ import annotations

import libcst as cst

from patchcraft.planning.records import EditSite
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.transforms._base import (
    FLAG,
    AnchorError,
    Outcome,
    assign_targets,
    edit_method,
    find_statements,
    insert_at,
    is_marked,
    line_of,
    marked_statement,
    self_attr_name,
    strip_marker_lines,
)

NAME = "init_capture_flag"
KIND = EditKind.INIT
DESCRIPTION = (
    "Put `self.capture_embedding_for_eagle3 = False` right after "
    "`self.layers_to_capture = []` in the inner model's __init__, so forward never "
    "raises AttributeError when the setter was not called with ids."
)
CODE = "# patchcraft: EAGLE-3 layer id -1 captures the embedding output\nself.%s = False\n" % FLAG


def _assigns(attr: str):
    def predicate(stmt: cst.BaseStatement) -> bool:
        return any(self_attr_name(t) == attr for t in assign_targets(stmt))

    return predicate


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    canonical = marked_statement(module, CODE)
    existing = find_statements(func, _assigns(FLAG))
    if existing:
        stmt = existing[0]
        same = strip_marker_lines(module, stmt) == strip_marker_lines(module, canonical)
        if same:
            return func, Outcome(EditStatus.PRESENT if is_marked(stmt) else EditStatus.HAND_APPLIED)
        return func, Outcome(
            EditStatus.MODIFIED, f"line {line_of(module, stmt)}: `{strip_marker_lines(module, stmt).strip()}`"
        )
    anchors = find_statements(func, _assigns("layers_to_capture"))
    if not anchors:
        raise AnchorError(site, "`self.layers_to_capture = []` in __init__")
    if len(anchors) > 1:
        raise AnchorError(site, f"one `self.layers_to_capture = ...` in __init__, found {len(anchors)} (ambiguous)")
    return insert_at(func, anchors[0], canonical, after=True), Outcome(EditStatus.APPLIED)


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)
