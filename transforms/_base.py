"""What every transform shares: finding its method, inserting marked code.

Every statement patchcraft inserts carries a leading ``# patchcraft:``
comment. That makes three things structural rather than textual:
recognising our own work (idempotence), reverting it byte for byte, and
telling a user's edit of our block apart from our block.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import libcst as cst

from patchcraft import MARKER
from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.class_graph import FLAG, SiteParams, parse_python
from patchcraft.planning.records import EditSite
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.transforms._slices import first_line, split_lines

#: How inserted code in ``forward`` reads the flag: a class that runs a patched
#: forward without the flag in its ``__init__`` (an out-of-tree subclass, one
#: patchcraft cannot see) then captures no embedding instead of crashing; the
#: setter refuses -1 for it (``hasattr``), so nothing is silent.
FLAG_READ = f'getattr(self, "{FLAG}", False)'
#: Added to a preallocated collector's capture count (``AuxHiddenStatePacker``):
#: the one in-expression edit patchcraft makes, recognised by this exact shape.
FLAG_COUNT = f"int({FLAG_READ})"
#: How an earlier patchcraft read the flag, and the count it wrote: still recognised,
#: reverted, and brought up to date by ``apply``.
LEGACY_FLAG_READS = (f"self.{FLAG}",)
LEGACY_FLAG_COUNTS = tuple(f"int({read})" for read in LEGACY_FLAG_READS)
_EMPTY_MODULE = cst.Module(body=())


class AnchorError(PatchcraftError):
    """An anchor is missing or ambiguous: name the file, class, method and expectation."""

    def __init__(self, site: EditSite, expected: str) -> None:
        super().__init__(f"{site.path}: {site.cls}.{site.method}: expected {expected}; file left untouched")
        self.site = site


@dataclass(frozen=True)
class Outcome:
    """What one transform found or did at one site."""

    status: EditStatus
    detail: str = ""


@dataclass(frozen=True)
class Example:
    """A before/after pair: it is a unit test and a section of docs/transforms.md."""

    title: str
    before: str
    after: str
    site: EditSite

    @classmethod
    def unchanged(cls, title: str, site: EditSite, text: str) -> "Example":
        """A case the transform must leave exactly as it is (already patched, or patched by hand)."""
        return cls(title=title, before=text, after=text, site=site)


def example_site(
    kind: EditKind, cls: str, method: str, params: SiteParams | None = None, path: str = "example.py"
) -> EditSite:
    """Where a transform's example edits: ``cls.method`` in a file of its own."""
    file = Path(path)
    return EditSite(kind=kind, path=file, module=file.stem, cls=cls, method=method, params=params)


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


def code_of(module: cst.Module, node: cst.CSTNode) -> str:
    return module.code_for_node(node)


def plain_code(node: cst.CSTNode) -> str:
    """The code of ``node`` on its own, in libcst's default style: for comparisons and searches."""
    return _EMPTY_MODULE.code_for_node(node)


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
        if self._depth == 0:  # leaving a class nested in the target is not leaving the target
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
    if editor.methods_seen == 0:
        raise AnchorError(site, f"one method {site.method}() in class {site.cls}, found none")
    if editor.methods_seen > 1:
        raise AnchorError(site, _duplicates(module, site, editor.methods_seen))
    assert editor.outcome is not None
    return new, editor.outcome


def _duplicates(module: cst.Module, site: EditSite, count: int) -> str:
    """What a class with ``count`` definitions of the edited method is told: the lines, which one runs, the ways out."""
    lines = _definition_lines(module.code, site.cls, site.method)
    where = f" (lines {', '.join(map(str, lines))}; Python uses the last one, line {lines[-1]})" if lines else ""
    return (
        f"one method {site.method}() in class {site.cls}, found {count} definitions{where}: "
        f"remove the copies so that one remains, or leave this model out by naming the models you serve with --model"
    )


def _definition_lines(code: str, cls: str, method: str) -> list[int]:
    """The line of each top-level ``def method`` of top-level class ``cls`` in ``code`` (empty if it does not parse)."""
    import ast

    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    return [
        item.lineno
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == cls
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method
    ]


def walk_statements(func: cst.FunctionDef) -> list:
    """Every statement of ``func`` (not inside nested defs) with its chain of enclosing blocks.

    The one statement walker of the transforms (:func:`find_statements` asks it).
    Each entry is ``(statement, ((block, index), ...))``: the blocks from the
    function body down to the statement's own block, and the position taken
    in each, in source order. Compound statements (if/elif/else, for, while,
    with, try with its ``except``, ``except*``, ``else`` and ``finally``) are
    entered; ``match`` cases are not.
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
    return [stmt for stmt, _ in walk_statements(func) if predicate(stmt)]


_STATEMENT_NODES = (
    cst.Module,
    cst.ClassDef,
    cst.FunctionDef,
    cst.IndentedBlock,
    cst.If,
    cst.Else,
    cst.For,
    cst.While,
    cst.With,
    cst.Try,
    cst.TryStar,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
    cst.Match,
    cst.MatchCase,
)


class _Inserter(cst.CSTTransformer):
    def __init__(self, anchor: cst.CSTNode, new: cst.BaseStatement, after: bool, replace: bool = False) -> None:
        super().__init__()
        self.anchor, self.new, self.after, self.replace, self.done = anchor, new, after, replace, False

    def on_visit(self, node: cst.CSTNode) -> bool:
        # The anchor is a statement of some indented block: expressions never hold one.
        return not self.done and isinstance(node, _STATEMENT_NODES)

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        for index, stmt in enumerate(original.body):
            if stmt is self.anchor:
                self.done = True
                body = list(updated.body)
                if self.replace:
                    body[index] = self.new
                else:
                    body.insert(index + 1 if self.after else index, self.new)
                return updated.with_changes(body=tuple(body))
        return updated


def insert_at(func: cst.FunctionDef, anchor: cst.CSTNode, new: cst.BaseStatement, *, after: bool) -> cst.FunctionDef:
    """Insert ``new`` right after (or before) the ``anchor`` statement of ``func``."""
    inserter = _Inserter(anchor, new, after)
    result = func.visit(inserter)
    assert inserter.done, "anchor statement not found in its own function"
    return result  # type: ignore[return-value]


def replace_statement(func: cst.FunctionDef, old: cst.CSTNode, new: cst.BaseStatement) -> cst.FunctionDef:
    """Put ``new`` in place of the ``old`` statement of ``func``."""
    inserter = _Inserter(old, new, after=False, replace=True)
    result = func.visit(inserter)
    assert inserter.done, "statement not found in its own function"
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


def is_flag_count(node: cst.CSTNode, current_only: bool = False) -> bool:
    """``<count> + int(getattr(self, "capture_embedding_for_eagle3", False))``: a widened capture count
    (or an earlier patchcraft's form of it, unless ``current_only``)."""
    forms = (FLAG_COUNT,) if current_only else (FLAG_COUNT, *LEGACY_FLAG_COUNTS)
    return (
        isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add) and plain_code(node.right) in forms
    )


def _flag_counts(text: str) -> int:
    return sum(text.count(form) for form in (FLAG_COUNT, *LEGACY_FLAG_COUNTS))


class RemoveMarked(cst.CSTTransformer):
    """Removes every statement that carries the patchcraft marker, and every widened count.

    Marked statements sit in indented blocks, so only statements are walked;
    expressions are entered only in a line that names the flag (a widened
    count). Skipping the rest is what keeps revert fast on big classes.
    """

    def __init__(self) -> None:
        super().__init__()
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
        self.removed_markers += sum(plain_code(s).count(MARKER) for s in updated.body if is_marked(s))
        return updated.with_changes(body=tuple(kept))

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BaseExpression) -> cst.BaseExpression:
        # The count was ``left`` before; ``left`` kept its own whitespace and parentheses.
        if is_flag_count(updated):
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
    # Lines as ``ast`` counts them: str.splitlines() also breaks at form feeds.
    wanted = [line.strip() for line in split_lines(code_of(module, node)) if line.strip()]
    if not wanted:
        return 0
    lines = [line.strip() for line in split_lines(module.code)]
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


def marked_parts(text: str) -> Optional[list]:
    """Where patchcraft text (marker or widened count) lies: ``(class, method)`` pairs of top-level classes.

    ``method`` is a method defined directly in the class body that holds
    some; it is None when some lies in the class but outside its methods
    (the whole class is then reverted). None when such text also lies
    outside every top-level class: the caller then reverts the whole module.
    Revert parses only these parts (the runner's class has thousands of lines).
    """
    if MARKER not in text and not _flag_counts(text):
        return []
    tree = parse_python(text)
    lines = split_lines(text)
    parts: list = []
    covered = 0
    for stmt in tree.body:
        if not isinstance(stmt, ast.ClassDef):
            continue
        count = _marks(lines, stmt)
        if not count:
            continue
        covered += count
        methods = [(f.name, n) for f in stmt.body if isinstance(f, _FUNCTIONS) and (n := _marks(lines, f))]
        if sum(n for _, n in methods) == count:
            parts.extend((stmt.name, name) for name, _ in methods)
        else:
            parts.append((stmt.name, None))
    if covered != text.count(MARKER) + _flag_counts(text):
        return None
    return parts


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _marks(lines: list, node: ast.stmt) -> int:
    """How much patchcraft text the lines of ``node`` (decorators included) hold."""
    segment = "".join(lines[first_line(node) : node.end_lineno])
    return segment.count(MARKER) + _flag_counts(segment)
