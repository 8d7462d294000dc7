"""What every transform shares: finding its method, inserting marked code.

Every statement patchcraft inserts carries a leading ``# patchcraft:``
comment. That makes three things structural rather than textual:
recognising our own work (idempotence), reverting it byte for byte, and
telling a user's edit of our block apart from our block.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

import libcst as cst

from patchcraft import MARKER
from patchcraft.errors import PatchcraftError
from patchcraft.graph import EditSite, parse_python

FLAG = "capture_embedding_for_eagle3"
#: Added to a preallocated collector's capture count (``AuxHiddenStatePacker``):
#: the one in-expression edit patchcraft makes, recognised by this exact shape.
FLAG_COUNT = f"int(self.{FLAG})"
_EMPTY_MODULE = cst.Module(body=())


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


def _walk_blocks(node: cst.CSTNode, found: list, predicate: Callable[[cst.BaseStatement], bool]) -> None:
    """Collect statements matching ``predicate`` in nested blocks, not in nested defs."""
    for stmt in getattr(node, "body", ()):
        if not isinstance(stmt, cst.BaseStatement):
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


Chain = tuple  # ((IndentedBlock, index), ...) from the function body down


def walk_statements(func: cst.FunctionDef) -> list:
    """Every statement of ``func`` (not inside nested defs) with its chain of enclosing blocks.

    Each entry is ``(statement, ((block, index), ...))``: the blocks from the
    function body down to the statement's own block, and the position taken
    in each. Compound statements (if/for/with/try/while) are entered.
    """
    found: list = []

    def visit_block(block: cst.BaseSuite, chain: tuple) -> None:
        if not isinstance(block, cst.IndentedBlock):
            return
        for index, stmt in enumerate(block.body):
            here = chain + ((block, index),)
            found.append((stmt, here))
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            for suite in _suites(stmt):
                visit_block(suite, here)

    visit_block(func.body, ())
    return found


def _suites(stmt: cst.CSTNode) -> list:
    """The indented blocks directly owned by a compound statement (else/elif/except included)."""
    suites: list = []
    for child in stmt.children:
        if isinstance(child, cst.IndentedBlock):
            suites.append(child)
        elif isinstance(child, (cst.Else, cst.If, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)):
            suites.extend(_suites(child))
    return suites


def find_statements(func: cst.FunctionDef, predicate: Callable[[cst.BaseStatement], bool]) -> list:
    """Statements of ``func`` at any block depth (not inside nested defs) matching ``predicate``."""
    found: list = []
    _walk_blocks(func.body, found, predicate)
    return found


_STATEMENT_NODES = (
    cst.Module, cst.ClassDef, cst.FunctionDef, cst.IndentedBlock, cst.If, cst.Else, cst.For, cst.While,
    cst.With, cst.Try, cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.Match, cst.MatchCase,
)


class _Inserter(cst.CSTTransformer):
    def __init__(self, anchor: cst.CSTNode, new: cst.BaseStatement, after: bool) -> None:
        super().__init__()
        self.anchor, self.new, self.after, self.done = anchor, new, after, False

    def on_visit(self, node: cst.CSTNode) -> bool:
        # The anchor is a statement of some indented block: expressions never hold one.
        return not self.done and isinstance(node, _STATEMENT_NODES)

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


def iter_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under ``node``, itself included: a plain walk over the node's fields.

    Much cheaper than a visitor, ``children`` or ``code_for_node`` on big
    functions; for read-only questions only.
    """
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for name in current.__dataclass_fields__:
            value = getattr(current, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (tuple, list)):
                stack.extend(item for item in value if isinstance(item, cst.CSTNode))


def _widens_a_count(line: cst.SimpleStatementLine) -> bool:
    """``x = Collector(<count> + int(self.<flag>), ...)``: the only place a count is widened."""
    for small in line.body:
        value = getattr(small, "value", None)
        if isinstance(small, (cst.Assign, cst.AnnAssign)) and isinstance(value, cst.Call):
            if any(is_flag_count(arg.value) for arg in value.args):
                return True
    return False


def is_flag_count(node: cst.CSTNode) -> bool:
    """``<count> + int(self.capture_embedding_for_eagle3)``: a widened capture count."""
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Add)
        and cst.Module(body=()).code_for_node(node.right) == FLAG_COUNT
    )


class RemoveMarked(cst.CSTTransformer):
    """Removes every statement that carries the patchcraft marker, and every widened count.

    Marked statements sit in indented blocks, so only statements are walked;
    expressions are entered only in a line that names the flag (a widened
    count). Skipping the rest is what keeps revert fast on big classes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.removed = 0
        #: How many marker comments the removed statements held (the rest is elsewhere).
        self.removed_markers = 0
        self._flag_lines: set = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._flag_lines:
            return True
        if isinstance(node, cst.SimpleStatementLine):
            if _widens_a_count(node):
                self._flag_lines.add(id(node))
                return True
            return False
        return isinstance(node, _STATEMENT_NODES)

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        self._flag_lines.discard(id(original))
        return super().on_leave(original, updated)

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        kept = [s for s in updated.body if not is_marked(s)]
        if len(kept) == len(updated.body):
            return updated
        self.removed += len(updated.body) - len(kept)
        self.removed_markers += sum(code_of(_EMPTY_MODULE, s).count(MARKER) for s in updated.body if is_marked(s))
        return updated.with_changes(body=tuple(kept))

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BaseExpression) -> cst.BaseExpression:
        # The count was ``left`` before; ``left`` kept its own whitespace and parentheses.
        if is_flag_count(updated):
            self.removed += 1
            return updated.left  # type: ignore[attr-defined]
        return updated


def line_of(module: cst.Module, node: cst.CSTNode) -> int:
    """1-based line of ``node``'s first own line in ``module``, for messages.

    Leading comment lines are not the statement, and every line of the
    statement must match (ignoring indentation, which ``code_for_node``
    does not reproduce for nested code), so an identical earlier line is not
    named instead.
    """
    if hasattr(node, "leading_lines"):
        node = node.with_changes(leading_lines=())  # type: ignore[attr-defined]
    wanted = [line.strip() for line in code_of(module, node).splitlines() if line.strip()]
    if not wanted:
        return 0
    lines = [line.strip() for line in module.code.splitlines()]
    for index, line in enumerate(lines):
        if line == wanted[0] and [l for l in lines[index : index + len(wanted) * 2] if l][: len(wanted)] == wanted:
            return index + 1
    return 0


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


# -- class slices: libcst parses only the classes it edits ----------------------

_LINE_END = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split where ``ast`` counts lines (not on form feeds)."""
    lines: list[str] = []
    start = 0
    for match in _LINE_END.finditer(text):
        lines.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


@dataclass
class ClassSlices:
    """A file cut into its top-level classes of interest and the text around them.

    libcst is slow on big files (deepseek_v2.py has over 3,000 lines) and
    every edit lies inside one top-level class, so only those classes are
    parsed, each as a module of its own, and spliced back line for line.
    The text outside them is never touched, so the result is byte-identical
    to a whole-file edit.
    """

    lines: list
    spans: dict  # class name -> (first line index, end line index)
    modules: dict  # class name -> cst.Module

    @classmethod
    def of(cls, text: str, names: Iterable[str], parse: Callable[[str, int], cst.Module]) -> Optional["ClassSlices"]:
        """Slices for ``names``; None when one is not exactly one top-level class.

        ``parse(code, first_line)`` parses one class, given after as many blank
        lines as precede it in the file, so that line numbers in messages are
        the file's. A syntax error in the file raises ``SyntaxError`` (the
        caller turns it into one clear line).
        """
        tree = parse_python(text)
        found: dict = {}
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef):
                found.setdefault(stmt.name, []).append(stmt)
        wanted = set(names)
        if any(len(found.get(name, ())) != 1 for name in wanted):
            return None
        lines = split_lines(text)
        spans = {}
        for name in wanted:
            node = found[name][0]
            first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            spans[name] = (first, node.end_lineno or node.lineno)
        modules = {name: parse(_padding(lines, a) + "".join(lines[a:b]), a) for name, (a, b) in spans.items()}
        return cls(lines=lines, spans=spans, modules=modules)

    def segment(self, name: str) -> str:
        """The original text of class ``name``."""
        first, end = self.spans[name]
        return "".join(self.lines[first:end])

    def text(self) -> str:
        """The whole file with every class replaced by its module's code."""
        parts: list = []
        at = 0
        for name, (first, end) in sorted(self.spans.items(), key=lambda item: item[1][0]):
            parts.extend(self.lines[at:first])
            pad = _padding(self.lines, first)
            code = self.modules[name].code
            assert code.startswith(pad), "the blank lines put before a class came back changed"
            parts.append(code[len(pad):])
            at = end
        parts.extend(self.lines[at:])
        return "".join(parts)


def _padding(lines: list, first: int) -> str:
    """Blank lines put before a class so that its module's line numbers are the file's.

    They use the class's own line ending, so libcst keeps the file's style
    for what it inserts.
    """
    if first == 0:
        return ""
    sample = lines[first] if first < len(lines) else "\n"
    newline = "\r\n" if sample.endswith("\r\n") else ("\r" if sample.endswith("\r") else "\n")
    return newline * first


def marked_classes(text: str) -> Optional[list]:
    """Top-level classes holding patchcraft text (marker or widened count).

    None when such text also lies outside every top-level class: the caller
    then reverts the whole module.
    """
    if MARKER not in text and FLAG_COUNT not in text:
        return []
    tree = parse_python(text)
    lines = split_lines(text)
    names: list = []
    covered = 0
    for stmt in tree.body:
        if not isinstance(stmt, ast.ClassDef):
            continue
        first = min([stmt.lineno] + [d.lineno for d in stmt.decorator_list]) - 1
        segment = "".join(lines[first : stmt.end_lineno])
        count = segment.count(MARKER) + segment.count(FLAG_COUNT)
        if count:
            names.append(stmt.name)
            covered += count
    if covered != text.count(MARKER) + text.count(FLAG_COUNT):
        return None
    return names
