"""Edit 4 (model runner): CUDA graphs capture the configured aux layer ids.

In SGLang 0.4.10-0.5.10 the graph runner (``CudaGraphRunner.__init__``)
and, from 0.5.6, the warm-up (``ModelRunner._dummy_run``) call
``set_eagle3_layers_to_capture()`` with no ids right before they run the
model, while ``ModelRunner.initialize`` passes the draft's
``eagle_aux_hidden_state_layer_ids`` only after ``init_device_graphs()``.
The ``if i in self.layers_to_capture`` branch (and our embedding flag) is
Python, frozen into each graph when it is captured, so every replay
captures the default layers and never the embedding. A weight update with
``recapture_cuda_graph=True`` resets the ids the same way.

The fix has two edits, both found by structure, never by release:

- ``pass-ids``: every call with no ids passes the model runner's configured
  ids instead, ``getattr(runner, "eagle_aux_hidden_state_layer_ids", None)``.
  With no ids configured that is ``None``: the very default the bare call
  asked for, so nothing else changes.
- ``remember-ids``: where ``initialize`` keeps the ids in a local that is
  read only after graph capture (0.4.10-0.5.6), a marked copy of the
  release's own block that reads the draft config goes before the first
  statement that captures graphs, with its setter call replaced by
  ``self.eagle_aux_hidden_state_layer_ids = <ids>``. From 0.5.8 the runner
  already keeps them there, in ``__init__``.

A changed call carries the marker as a comment inside its parentheses, so
``revert`` (:func:`revert`) gives back exactly ``()``; the copied block is
an ordinary marked statement that the generic revert removes.

Where the edits go, and with which parameters, is planned from the structure
of ``model_executor/`` in :mod:`patchcraft.planning.runner_edits`; this module only
applies them.
"""

from __future__ import annotations

from typing import AbstractSet, Optional

import libcst as cst

from patchcraft import MARKER
from patchcraft.base.status import EditStatus
from patchcraft.reading.class_graph import SETTER
from patchcraft.planning.records import EditSite

# KIND and ROW are the planner's (one definition each); this module gives them to the engine and the docs.
from patchcraft.planning.runner_edits import ATTR, BEFORE_CAPTURE, KIND, ROW, PassIds, RememberIds  # noqa: F401
from patchcraft.transforms._base import AnchorError, Outcome, edit_method, insert_at, is_marked, line_of, plain_code

NAME = "configure_ids_before_graphs"
DESCRIPTION = (
    "In srt/model_executor/, make every set_eagle3_layers_to_capture() call made before "
    "CUDA-graph capture (graph runner, warm-up, recapture after a weight update) pass the "
    "model runner's configured aux layer ids, read from the draft config before any graph "
    "is captured, so replays capture the draft's layers (embedding included), not the defaults."
)
PASS_COMMENT = f"{MARKER} graphs freeze the layers to capture: pass the configured ids, not the defaults"
REMEMBER_COMMENT = f"{MARKER} read the draft's EAGLE-3 aux layer ids before any graph is captured"


# -- applying (libcst) ---------------------------------------------------------


def is_marked_call(call: cst.Call) -> bool:
    """A call whose arguments patchcraft wrote: the marker sits inside its parentheses."""
    space = call.whitespace_before_args
    if not isinstance(space, cst.ParenthesizedWhitespace):
        return False
    comments = [line.comment for line in space.empty_lines] + [space.first_line.comment]
    return any(c is not None and c.value.startswith(MARKER) for c in comments)


def _is_setter(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == SETTER


def canonical_call(module: cst.Module, edit: PassIds) -> cst.Call:
    """The patched call: the runner's configured ids, behind the marker comment."""
    code = f'_.{SETTER}(\n    {PASS_COMMENT}\n    getattr({edit.runner}, "{edit.attr}", None)\n)\n'
    stmt = cst.parse_statement(code, config=module.config_for_parsing)
    assert isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr)
    call = stmt.body[0].value
    assert isinstance(call, cst.Call)
    return call


class _PassIds(cst.CSTTransformer):
    def __init__(self, module: cst.Module, edit: PassIds) -> None:
        super().__init__()
        self.edit = edit
        self.receiver = f"{edit.runner}.{edit.model}"
        self.canonical = canonical_call(module, edit)
        self.statuses: list[EditStatus] = []
        self.odd: Optional[cst.Call] = None

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not _is_setter(updated) or plain_code(updated.func.value) != self.receiver:  # type: ignore[attr-defined]
            return updated
        if is_marked_call(updated):
            same = plain_code(updated.with_changes(func=self.canonical.func)) == plain_code(self.canonical)
            self.statuses.append(EditStatus.PRESENT if same else EditStatus.MODIFIED)
            return updated
        if updated.args:
            if ATTR in plain_code(updated) or self.edit.attr in plain_code(updated):
                self.statuses.append(EditStatus.HAND_APPLIED)
            return updated
        space = updated.whitespace_before_args
        if not (isinstance(space, cst.SimpleWhitespace) and space.value == ""):
            self.odd = original
            return updated
        self.statuses.append(EditStatus.APPLIED)
        return updated.with_changes(
            args=self.canonical.args, whitespace_before_args=self.canonical.whitespace_before_args
        )


def _pass_ids(
    module: cst.Module, func: cst.FunctionDef, site: EditSite, edit: PassIds
) -> tuple[cst.FunctionDef, Outcome]:
    editor = _PassIds(module, edit)
    new = func.visit(editor)
    if not isinstance(new, cst.FunctionDef):  # the visitor edits calls only: the method itself stays
        raise AnchorError(site, f"{site.method} to stay a method after its {SETTER}() call is edited")
    if editor.odd is not None:
        raise AnchorError(
            site,
            f"`{editor.receiver}.{SETTER}()` with nothing between its parentheses (found `{plain_code(editor.odd)}`)",
        )
    statuses = editor.statuses
    if EditStatus.MODIFIED in statuses:
        return func, Outcome(EditStatus.MODIFIED, f"the ids passed to {SETTER} were changed by hand")
    for status in (EditStatus.APPLIED, EditStatus.PRESENT, EditStatus.HAND_APPLIED):
        if status in statuses:
            return new, Outcome(status)
    raise AnchorError(site, f"a `{editor.receiver}.{SETTER}()` call")


class _CaptureFinder(cst.CSTVisitor):
    """Does a statement capture graphs, reset the ids, or call a method that does?"""

    def __init__(self, anchors: AbstractSet[str]) -> None:
        super().__init__()
        self.anchors = anchors
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            if isinstance(func.value, cst.Name) and func.value.value == "self" and func.attr.value in self.anchors:
                self.found = True
            if func.attr.value == SETTER and (not node.args or is_marked_call(node)):
                self.found = True

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value.endswith("GraphRunner"):
            self.found = True

    def visit_Name(self, node: cst.Name) -> None:
        if node.value.endswith("GraphRunner"):
            self.found = True


def _captures(stmt: cst.CSTNode, anchors: AbstractSet[str]) -> bool:
    finder = _CaptureFinder(anchors)
    stmt.visit(finder)
    return finder.found


class _SwapSetterCall(cst.CSTTransformer):
    """In the copy, ``self.model.set_...(ids)`` becomes ``self.<attr> = ids``."""

    def __init__(self, module: cst.Module, name: str, attr: str) -> None:
        super().__init__()
        self.module, self.name, self.attr, self.count = module, name, attr, 0

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        if not _is_configuring_line(updated, self.name):
            return updated
        self.count += 1
        new = cst.parse_statement(f"self.{self.attr} = {self.name}\n", config=self.module.config_for_parsing)
        return new.with_changes(leading_lines=updated.leading_lines)


def _is_configuring_line(stmt: cst.CSTNode, name: str) -> bool:
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return False
    call = stmt.body[0].value
    return (
        isinstance(call, cst.Call)
        and _is_setter(call)
        and len(call.args) == 1
        and isinstance(call.args[0].value, cst.Name)
        and call.args[0].value.value == name
    )


class _LineFinder(cst.CSTVisitor):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.found: list[cst.SimpleStatementLine] = []

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if _is_configuring_line(node, self.name):
            self.found.append(node)


def _configuring_lines(node: cst.CSTNode, name: str) -> list[cst.SimpleStatementLine]:
    finder = _LineFinder(name)
    node.visit(finder)
    return finder.found


def _marked_remembers(func: cst.FunctionDef, attr: str) -> list[cst.BaseStatement]:
    found: list[cst.BaseStatement] = []

    class Finder(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            if is_marked(node):
                found.append(node)

        def visit_If(self, node: cst.If) -> None:
            if is_marked(node):
                found.append(node)

    func.visit(Finder())
    return [s for s in found if f"self.{attr} =" in plain_code(s)]


def remember_block(module: cst.Module, block: cst.BaseStatement, edit: RememberIds) -> cst.BaseStatement:
    """The marked copy of the configuring ``block``, keeping the ids on the runner."""
    swap = _SwapSetterCall(module, edit.name, edit.attr)
    copy = block.visit(swap)
    assert swap.count == 1 and isinstance(copy, cst.BaseStatement)
    comment = cst.EmptyLine(comment=cst.Comment(REMEMBER_COMMENT))
    return copy.with_changes(leading_lines=(comment,))


def remember_line(module: cst.Module, edit: RememberIds) -> cst.BaseStatement:
    code = f"{REMEMBER_COMMENT}\nself.{edit.attr} = {edit.name}\n"
    return cst.parse_statement(code, config=module.config_for_parsing)


def _remember_ids(
    module: cst.Module, func: cst.FunctionDef, site: EditSite, edit: RememberIds
) -> tuple[cst.FunctionDef, Outcome]:
    name, attr = edit.name, edit.attr
    body = list(func.body.body) if isinstance(func.body, cst.IndentedBlock) else []
    holders = [s for s in body if not is_marked(s) and _configuring_lines(s, name)]
    if len(holders) != 1:
        raise AnchorError(site, f"one `self.<model>.{SETTER}({name})` call in {site.method}, found {len(holders)}")
    block = holders[0]
    before = edit.where == BEFORE_CAPTURE
    canonical = remember_block(module, block, edit) if before else remember_line(module, edit)
    existing = _marked_remembers(func, attr)
    if existing:
        same = plain_code(existing[0].with_changes(leading_lines=())) == plain_code(
            canonical.with_changes(leading_lines=())
        )  # type: ignore[call-arg]
        if same:
            return func, Outcome(EditStatus.PRESENT)
        return func, Outcome(
            EditStatus.MODIFIED,
            f"line {line_of(module, existing[0])}: the block that keeps the ids was changed by hand",
        )
    if not before:
        return insert_at(func, _configuring_lines(block, name)[0], canonical, after=True), Outcome(EditStatus.APPLIED)
    capture = next((s for s in body if _captures(s, edit.anchors)), None)
    if capture is None or body.index(capture) > body.index(block):
        raise AnchorError(site, "the statement that captures graphs, before the one that configures the ids")
    return insert_at(func, capture, canonical, after=False), Outcome(EditStatus.APPLIED)


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    """Apply one runner site (``pass-ids`` or ``remember-ids``) to ``module``."""
    edit = site.params
    if not isinstance(edit, (PassIds, RememberIds)):
        raise TypeError(f"runner site {site.cls}.{site.method} has {type(edit).__name__}, not PassIds or RememberIds")
    if isinstance(edit, PassIds):
        return edit_method(module, site, lambda module, func, site: _pass_ids(module, func, site, edit))
    return edit_method(module, site, lambda module, func, site: _remember_ids(module, func, site, edit))


class _RevertCalls(cst.CSTTransformer):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if _is_setter(updated) and is_marked_call(updated):
            return updated.with_changes(args=(), whitespace_before_args=cst.SimpleWhitespace(""))
        return updated


def revert(module: cst.Module) -> cst.Module:
    """Give every call this transform changed its ``()`` back (marked statements go elsewhere)."""
    return module.visit(_RevertCalls())
