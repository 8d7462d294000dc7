"""Take the methods under test out of a model file, as the file's own code.

libcst gives the exact text of each method of a top-level class (comments
and all); ``ast`` gives its line number and compiles it, so a traceback
from the harness points at the real line of the real file. Nothing here
imports torch.

The unpatched original of a method is ``revert_text`` applied to that
method's own text: every patchcraft edit is a marked statement inside a
method, so reverting the method is reverting the file, without parsing a
3,000-line file twice.
"""

from __future__ import annotations

import __future__
import ast
import dis
import re
import types
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterator, Optional

import libcst as cst

from patchcraft import MARKER
from patchcraft.engine.file_patch import revert_text
from patchcraft.reading.class_graph import FLAG
from patchcraft.reading.parsed import parse_cst, parse_python
from patchcraft.base.sources import read_source

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")

PATCHED = "patched"
ORIGINAL = "original"


@dataclass(frozen=True)
class MethodCode:
    """One method's text, dedented so that it starts with ``def``."""

    path: Path
    cls: str
    name: str
    line: int
    text: str
    decorators: tuple[str, ...] = ()

    def reverted(self) -> "MethodCode":
        """The same method with every patchcraft edit removed (itself when it has none).

        Every edit mentions the flag (the widened packer count has no marker comment).
        """
        if MARKER not in self.text and FLAG not in self.text:
            return self
        return MethodCode(self.path, self.cls, self.name, self.line, _revert(self.text, self.path), self.decorators)

    def tree(self) -> ast.Module:
        """The method as a module holding one function, at its real line numbers.

        Parsed once; callers build new trees around its nodes and never change them.
        """
        return _parse(self.text, self.line, str(self.path))


@lru_cache(maxsize=1024)
def _revert(text: str, path: Path) -> str:
    return revert_text(text, path)


@lru_cache(maxsize=4096)
def _parse(text: str, line: int, filename: str) -> ast.Module:
    return ast.parse("\n" * (line - 1) + text, filename=filename)


@dataclass
class ModelSource:
    """One model file: its text, and its libcst and ``ast`` trees on first use."""

    path: Path
    text: str
    _methods: dict = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> "ModelSource":
        return cls(path=path, text=read_source(path).text)

    @cached_property
    def syntax(self) -> ast.Module:
        """The file's ``ast`` tree, shared with planning's parse of the same text (read-only, as every reader's)."""
        try:
            return parse_python(self.text)
        except SyntaxError:
            return ast.parse(self.text, filename=str(self.path))  # raises again, naming the file

    @cached_property
    def _file_lines(self) -> list[str]:
        """Lines with their endings, split only where ``ast`` counts lines (not on form feeds)."""
        return _LINE.findall(self.text)

    def _class_node(self, name: str) -> Optional[ast.ClassDef]:
        """The top-level class ``name`` (the last one, as Python binds it)."""
        found = [s for s in self.syntax.body if isinstance(s, ast.ClassDef) and s.name == name]
        return found[-1] if found else None

    def _method_node(self, cls: str, name: str) -> Optional[ast.FunctionDef | ast.AsyncFunctionDef]:
        node = self._class_node(cls)
        found = [
            f
            for f in (node.body if node else [])
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == name
        ]
        return found[-1] if found else None

    def method(self, cls: str, name: str) -> Optional[MethodCode]:
        """Method ``name`` of top-level class ``cls``, its text taken with libcst.

        Only the method's own lines are parsed (inside a stand-in ``class``
        header, so their indentation stays valid): a method is self-contained,
        and parsing one method instead of a 3,000-line file keeps the harness
        fast.
        """
        key = (cls, name)
        if key in self._methods:
            return self._methods[key]
        node = self._method_node(cls, name)
        found = None
        if node is not None:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = self._file_lines[first - 1 : node.end_lineno]
            module = parse_cst("class _:\n" + "".join(lines))
            holder = module.body[0]
            assert isinstance(holder, cst.ClassDef) and isinstance(holder.body, cst.IndentedBlock)
            func = holder.body.body[0]
            assert isinstance(func, cst.FunctionDef), (cls, name)
            decorators = tuple(module.code_for_node(d.decorator) for d in func.decorators)
            bare = func.with_changes(leading_lines=(), decorators=())
            found = MethodCode(self.path, cls, name, node.lineno, module.code_for_node(bare), decorators)
        self._methods[key] = found
        return found

    def class_literals(self, cls: str) -> dict[str, object]:
        """``NAME = <literal>`` statements of the class body (class attributes)."""
        values: dict[str, object] = {}
        node = self._class_node(cls)
        for item in node.body if node is not None else []:
            if isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
                if _is_literal(item.value):
                    values[item.targets[0].id] = ast.literal_eval(item.value)
        return values

    @cached_property
    def imports(self) -> dict[str, tuple[str, Optional[str]]]:
        """Module-level import bindings: name -> (module, attribute or None)."""
        found: dict[str, tuple[str, Optional[str]]] = {}
        for stmt in _module_level(self.syntax.body):
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        found[alias.asname] = (alias.name, None)
                    else:
                        head = alias.name.split(".")[0]
                        found[head] = (head, None)
            elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                for alias in stmt.names:
                    found[alias.asname or alias.name] = (stmt.module, alias.name)
        return found

    @cached_property
    def defined(self) -> set[str]:
        """Names the module itself binds at import time (assignments, defs, classes)."""
        names: set[str] = set()
        for stmt in _module_level(self.syntax.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
                targets = list(getattr(stmt, "targets", None) or [getattr(stmt, "target", None)])
                targets += [item.optional_vars for item in getattr(stmt, "items", [])]
                names |= {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
        return names

    @cached_property
    def future_flags(self) -> int:
        """The ``from __future__ import ...`` compiler flags of the file (annotations, say)."""
        flags = 0
        for stmt in self.syntax.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                for alias in stmt.names:
                    feature = getattr(__future__, alias.name, None)
                    flags |= feature.compiler_flag if feature is not None else 0
        return flags


def _module_level(body: list) -> Iterator[ast.stmt]:
    """Statements run at import time, including those inside top-level if/try."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _module_level(stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _module_level(stmt.body + stmt.orelse + stmt.finalbody)
            for handler in stmt.handlers:
                yield from _module_level(handler.body)


# -- __init__ ------------------------------------------------------------------


def _self_target(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _statements(body: list) -> Iterator[ast.stmt]:
    """Statements at any block depth, not inside nested functions or classes."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(stmt, name, []) or [])
        for handler in getattr(stmt, "handlers", []) or []:
            yield from _statements(handler.body)


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _literal_self_assignment(stmt: ast.stmt) -> bool:
    """``self.x = <literal>`` (or annotated): one target, a value ``ast.literal_eval`` accepts."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target, value = stmt.targets[0], stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        target, value = stmt.target, stmt.value
    else:
        return False
    return _self_target(target) is not None and _is_literal(value)


def literal_init(init: MethodCode, one_rank: bool = False) -> Optional[types.CodeType]:
    """A code object running the literal ``self.x = <literal>`` statements of ``init``, in order.

    The statements are the file's own nodes at their own line numbers,
    wrapped in ``def __init_literals__(self)``; None when there are none.
    Branch conditions are not evaluated: in an ``if``/``else`` the later
    branch wins, which is the default in SGLang's inits (``else: self.x = None``).
    ``one_rank`` (vLLM's harness runs one rank, the first and the last
    pipeline stage at once): an ``if <...>.is_last_rank:`` or
    ``is_first_rank`` test is taken, so its ``else`` sets nothing (0.26's
    DeepSeek-V4 allocates ``self._mtp_hidden_buffer`` on the last rank and
    sets it to None elsewhere). :func:`top_level_literals` says which ones
    run unconditionally.
    """
    func = init.tree().body[0]
    skipped = {id(s) for s in _rank_else_statements(func)} if one_rank else set()
    kept = [
        stmt
        for stmt in _statements(func.body)  # type: ignore[attr-defined]
        if _literal_self_assignment(stmt) and id(stmt) not in skipped
    ]
    if not kept:
        return None
    wrapper = ast.FunctionDef(
        name="__init_literals__",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg="self")], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=kept,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    ast.copy_location(wrapper, kept[0])
    wrapper.end_lineno = max(s.end_lineno or s.lineno for s in kept)
    module = ast.Module(body=[wrapper], type_ignores=[])
    ast.fix_missing_locations(module)
    return compile(module, str(init.path), "exec", dont_inherit=True)


def _rank_else_statements(func: ast.AST) -> Iterator[ast.stmt]:
    """The statements under the ``else`` of each ``if <...>.is_last_rank:`` / ``is_first_rank`` test."""
    for node in ast.walk(func):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Attribute)
            and node.test.attr in ("is_last_rank", "is_first_rank")
        ):
            yield from _statements(node.orelse)


def top_level_literals(init: MethodCode) -> set[str]:
    """The ``self.<name>`` that ``init`` sets to a literal at its top level, whatever the branches."""
    func = init.tree().body[0]
    return {
        _self_target(stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target) or ""  # type: ignore[union-attr]
        for stmt in func.body  # type: ignore[attr-defined]
        if _literal_self_assignment(stmt)
    } - {""}


def init_attributes(init: MethodCode) -> set[str]:
    """Every ``self.<name>`` that ``init`` assigns, literal or not."""
    names: set[str] = set()
    for node in ast.walk(init.tree()):
        targets: list = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                name = _self_target(leaf)  # type: ignore[arg-type]
                if name:
                    names.add(name)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            if len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
                if isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    names.add(node.args[1].value)
    return names


# -- compiled code -------------------------------------------------------------


def global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the code nested in it) looks up as globals."""
    names: set[str] = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"):
            names.add(str(instruction.argval).replace(" + NULL", "").replace("NULL + ", ""))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return names
