"""What every transform shares: finding its method, inserting marked code.

Every statement patchcraft inserts carries a leading ``# patchcraft:``
comment. That makes three things structural rather than textual:
recognising our own work (idempotence), reverting it byte for byte, and
telling a user's edit of our block apart from our block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import libcst as cst

from patchcraft import MARKER
from patchcraft.errors import PatchcraftError
from patchcraft.graph import EditSite

FLAG = "capture_embedding_for_eagle3"


class AnchorError(PatchcraftError):
    """An anchor is missing or ambiguous: name the file, class, method and expectation."""

    def __init__(self, site: EditSite, expected: str) -> None:
        super().__init__(
            f"{site.path}: {site.cls}.{site.method}: expected {expected}; file left untouched"
        )
        self.site = site


@dataclass(frozen=True)
class Outcome:
    """What one transform found or did at one site."""

    status: str  # "applied" | "present" | "hand-applied" | "missing" | "modified"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("applied", "present", "hand-applied")


@dataclass(frozen=True)
class Example:
    """A before/after pair: it is a unit test and a section of docs/transforms.md."""

    title: str
    before: str
    after: str
    site: EditSite


def is_marked(stmt: cst.CSTNode) -> bool:
    lines = getattr(stmt, "leading_lines", ())
    return any(line.comment is not None and line.comment.value.startswith(MARKER) for line in lines)


def marked_statement(module: cst.Module, code: str) -> cst.BaseStatement:
    """Parse ``code`` (which starts with the marker comment) in ``module``'s style."""
    stmt = cst.parse_statement(code, config=module.config_for_parsing)
    assert is_marked(stmt), code
    return stmt


def body_of(func: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    body = func.body
    if not isinstance(body, cst.IndentedBlock):
        return ()
    return body.body  # type: ignore[return-value]


def with_body(func: cst.FunctionDef, body: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    return func.with_changes(body=func.body.with_changes(body=tuple(body)))


def code_of(module: cst.Module, node: cst.CSTNode) -> str:
    return module.code_for_node(node)


def strip_marker_lines(module: cst.Module, stmt: cst.BaseStatement) -> str:
    """The code of ``stmt`` without its leading comment lines, for comparisons."""
    return code_of(module, stmt.with_changes(leading_lines=()))  # type: ignore[call-arg]


MethodEdit = Callable[[cst.Module, cst.FunctionDef, EditSite], "tuple[cst.FunctionDef, Outcome]"]


class _MethodEditor(cst.CSTTransformer):
    """Runs ``edit`` on ``site.cls.site.method`` at module top level only."""

    def __init__(self, module: cst.Module, site: EditSite, edit: MethodEdit) -> None:
        super().__init__()
        self.module = module
        self.site = site
        self.edit = edit
        self.classes_seen = 0
        self.methods_seen = 0
        self.outcome: Optional[Outcome] = None
        self._depth = 0
        self._in_target = False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._depth += 1
        if self._depth == 1 and node.name.value == self.site.cls:
            self.classes_seen += 1
            self._in_target = True
            return True
        return False

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self._depth -= 1
        self._in_target = False
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if not (self._in_target and self._depth == 1 and original.name.value == self.site.method):
            return updated
        self.methods_seen += 1
        if self.methods_seen > 1:
            return updated
        new, self.outcome = self.edit(self.module, updated, self.site)
        return new


def edit_method(module: cst.Module, site: EditSite, edit: MethodEdit) -> tuple[cst.Module, Outcome]:
    """Apply ``edit`` to the one method named by ``site``; raise if it is not exactly one."""
    editor = _MethodEditor(module, site, edit)
    new = module.visit(editor)
    if editor.classes_seen != 1:
        what = "no" if editor.classes_seen == 0 else f"{editor.classes_seen}"
        raise AnchorError(site, f"exactly one top-level class {site.cls}, found {what}")
    if editor.methods_seen != 1:
        what = "none" if editor.methods_seen == 0 else f"{editor.methods_seen} definitions"
        raise AnchorError(site, f"one method {site.method}() in class {site.cls}, found {what}")
    assert editor.outcome is not None
    return new, editor.outcome


def remove_marked(func: cst.FunctionDef) -> cst.FunctionDef:
    """Drop every marked statement from ``func``'s top-level body."""
    return with_body(func, [s for s in body_of(func) if not is_marked(s)])


def _walk_blocks(node: cst.CSTNode, found: list, predicate: Callable[[cst.BaseStatement], bool]) -> None:
    """Collect statements matching ``predicate`` in nested blocks, not in nested defs."""
    for stmt in getattr(node, "body", ()):
        if not isinstance(stmt, cst.CSTNode):
            continue
        if predicate(stmt):
            found.append(stmt)
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        for child in stmt.children:
            if isinstance(child, (cst.IndentedBlock, cst.Else, cst.If, cst.Try, cst.ExceptHandler, cst.Finally)):
                _walk_blocks_child(child, found, predicate)


def _walk_blocks_child(node: cst.CSTNode, found: list, predicate: Callable[[cst.BaseStatement], bool]) -> None:
    if isinstance(node, cst.IndentedBlock):
        _walk_blocks(node, found, predicate)
        return
    for child in node.children:
        if isinstance(child, (cst.IndentedBlock, cst.Else, cst.If, cst.ExceptHandler, cst.Finally)):
            _walk_blocks_child(child, found, predicate)


def find_statements(func: cst.FunctionDef, predicate: Callable[[cst.BaseStatement], bool]) -> list:
    """Statements of ``func`` at any block depth (not inside nested defs) matching ``predicate``."""
    found: list = []
    _walk_blocks(func.body, found, predicate)
    return found


class _Inserter(cst.CSTTransformer):
    def __init__(self, anchor: cst.CSTNode, new: cst.BaseStatement, after: bool) -> None:
        super().__init__()
        self.anchor, self.new, self.after, self.done = anchor, new, after, False

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        for index, stmt in enumerate(original.body):
            if stmt is self.anchor:
                self.done = True
                at = index + 1 if self.after else index
                body = list(updated.body)
                body.insert(at, self.new)
                return updated.with_changes(body=tuple(body))
        return updated


def insert_at(func: cst.FunctionDef, anchor: cst.CSTNode, new: cst.BaseStatement, *, after: bool) -> cst.FunctionDef:
    """Insert ``new`` right after (or before) the ``anchor`` statement of ``func``."""
    inserter = _Inserter(anchor, new, after)
    result = func.visit(inserter)
    assert inserter.done, "anchor statement not found in its own function"
    return result  # type: ignore[return-value]


class RemoveMarked(cst.CSTTransformer):
    """Removes every statement that carries the patchcraft marker."""

    def __init__(self) -> None:
        super().__init__()
        self.removed = 0

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        kept = [s for s in updated.body if not is_marked(s)]
        if len(kept) == len(updated.body):
            return updated
        self.removed += len(updated.body) - len(kept)
        return updated.with_changes(body=tuple(kept))


def line_of(module: cst.Module, node: cst.CSTNode) -> int:
    """1-based line of ``node``'s code in ``module`` (first match), for messages."""
    text = code_of(module, node).strip("\r\n")
    first = text.splitlines()[0] if text else ""
    at = module.code.find(first)
    return module.code.count("\n", 0, at) + 1 if at >= 0 else 0


def self_attr_name(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return node.attr.value
    return None


def assign_targets(stmt: cst.BaseStatement) -> list:
    """Targets of the assignments in a simple statement line."""
    targets: list = []
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                targets.extend(t.target for t in small.targets)
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                targets.append(small.target)
    return targets


def mentions(node: cst.CSTNode, dotted: str) -> bool:
    """Whether the code of ``node`` contains the attribute chain ``dotted``."""
    return dotted in cst.Module(body=()).code_for_node(node)
