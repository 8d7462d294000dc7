"""Slices: libcst parses only the methods (or classes) it edits.

libcst is slow on big files, and every edit lies inside one method of one
top-level class. :class:`ClassSlices` cuts a file into the parts libcst must
see and splices the edited parts back, line for line, so the result is
byte-identical to a whole-file edit. Pure text and ``ast`` work; nothing
here knows what a transform does.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import libcst as cst

from patchcraft.reading.class_graph import parse_python

_LINE_END = re.compile(r"\r\n|\r|\n")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


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
    """A file cut into the parts libcst must see, and the text around them.

    libcst is slow on big files (deepseek_v2.py has over 3,000 lines) and
    every edit lies inside one method, so only the edited methods are parsed
    (:meth:`of_methods`), or whole top-level classes (:meth:`of`); each part
    is a module of its own, spliced back line for line. The text outside
    the parts is never touched, so the result is byte-identical to a
    whole-file edit.
    """

    lines: list
    spans: dict  # key -> (first line index, end line index) of the file text a module replaces
    modules: dict  # key -> cst.Module
    #: key -> the text a module holds before its span: line padding, and a
    #: method's class header. It comes back unchanged and is cut off again.
    prefixes: dict = field(default_factory=dict)

    @classmethod
    def of(cls, text: str, names: Iterable[str], parse: Callable[[str, int], cst.Module]) -> Optional["ClassSlices"]:
        """Whole-class slices for ``names``, keyed by class name; None when one is not exactly one top-level class.

        ``parse(code, first_line)`` parses one slice, given after padding
        as many lines long as precede it in the file, so that line numbers
        in messages are the file's. A syntax error in the file raises
        ``SyntaxError`` (the caller turns it into one clear line).
        """
        classes = _top_level_classes(text)
        if any(len(classes.get(name, ())) != 1 for name in set(names)):
            return None
        lines = split_lines(text)
        slices = cls(lines=lines, spans={}, modules={})
        for name in set(names):
            slices._add_class(name, classes[name][0])
        slices._parse(parse)
        return slices

    @classmethod
    def of_methods(
        cls, text: str, methods: Iterable[tuple[str, str]], parse: Callable[[str, int], cst.Module]
    ) -> Optional["ClassSlices"]:
        """Slices for ``(class, method)`` pairs, keyed by the pair (see :meth:`key`); ``(class, None)``: the whole class.

        Each module holds the class header (decorators, ``class X(...):`` and
        the comments after it) and one method, at their own lines. A class
        whose method is missing, defined twice or nested in a statement is
        sliced whole instead, so the transform finds and names that anchor
        problem itself; None when a class is not exactly one top-level class.
        """
        wanted: dict[str, set[str]] = {}
        for name, method in methods:
            wanted.setdefault(name, set()).add(method)
        classes = _top_level_classes(text)
        if any(len(classes.get(name, ())) != 1 for name in wanted):
            return None
        slices = cls(lines=split_lines(text), spans={}, modules={})
        for name, names in wanted.items():
            node = classes[name][0]
            funcs = {method: _sliceable(slices.lines, node, method) for method in names if method is not None}
            sliceable = {method: func for method, func in funcs.items() if func is not None}
            if None in names or len(sliceable) < len(funcs):
                slices._add_class(name, node)
                continue
            for method, func in sliceable.items():
                slices._add_method(name, node, method, func)
        slices._parse(parse)
        return slices

    def key(self, cls: str, method: str) -> object:
        """The key of the module holding ``cls.method``: its method slice, or its class slice."""
        return (cls, method) if (cls, method) in self.spans else cls

    def segment(self, key: object) -> str:
        """The original text a slice replaces."""
        first, end = self.spans[key]
        return "".join(self.lines[first:end])

    def text(self) -> str:
        """The whole file with every slice replaced by its module's code."""
        parts: list = []
        at = 0
        for key, (first, end) in sorted(self.spans.items(), key=lambda item: item[1][0]):
            parts.extend(self.lines[at:first])
            prefix = self.prefixes[key]
            code = code_with_ending(self.modules[key], "".join(self.lines[end - 1 : end]))
            assert code.startswith(prefix), "the padding or class header put before a slice came back changed"
            parts.append(code[len(prefix) :])
            at = end
        parts.extend(self.lines[at:])
        return "".join(parts)

    def _add_class(self, name: str, node: ast.ClassDef) -> None:
        first = first_line(node)
        self.spans[name] = (first, node.end_lineno or node.lineno)
        self.prefixes[name] = _padding(first, _newline(self.lines, first))

    def _add_method(self, name: str, node: ast.ClassDef, method: str, func: ast.stmt) -> None:
        first, header_end, start = first_line(node), first_line(node.body[0]), first_line(func)
        newline = _newline(self.lines, first)
        header = "".join(self.lines[first:header_end])
        # The header's own comments and blank lines may end it: the gap is a
        # string in the class body, at the method's own indentation.
        gap = _padding(start - header_end, newline, _indent(self.lines[start]))
        self.spans[(name, method)] = (start, func.end_lineno or func.lineno)
        self.prefixes[(name, method)] = _padding(first, newline) + header + gap

    def _parse(self, parse: Callable[[str, int], cst.Module]) -> None:
        for key, (first, end) in self.spans.items():
            self.modules[key] = parse(self.prefixes[key] + "".join(self.lines[first:end]), first)


def code_with_ending(module: cst.Module, source: str) -> str:
    """``module.code``, ending as ``source`` (the text it was parsed from) ends.

    libcst looks for a final ``\n`` only: a module ending in a bare ``\r``
    (old Mac line endings) comes back without it, and the next line of the
    file would join the slice's last line.
    """
    code = module.code
    if source.endswith("\r") and not code.endswith("\r"):
        code += "\r"
    return code


def _top_level_classes(text: str) -> dict:
    """Class name -> its top-level definitions (ast), in file order."""
    found: dict = {}
    for stmt in parse_python(text).body:
        if isinstance(stmt, ast.ClassDef):
            found.setdefault(stmt.name, []).append(stmt)
    return found


def first_line(node: ast.stmt) -> int:
    """0-based index of a statement's first line, decorators included."""
    decorators = getattr(node, "decorator_list", ())
    return min([node.lineno] + [d.lineno for d in decorators]) - 1


def _sliceable(lines: list, node: ast.ClassDef, method: str) -> Optional[ast.stmt]:
    """The definition of ``method`` when it can be sliced alone, else None.

    It must be the one definition of that name the transform would find
    (a direct child, no other in an ``if``/``try`` of the class body), at
    the indentation of the class body's first statement (libcst infers the
    indentation of inserted code from that one), and must not end in a
    backslash (the slice would end mid-line).
    """
    found = _definitions(node.body, method)
    if len(found) != 1 or found[0] not in node.body:
        return None
    func = found[0]
    start, body_start = first_line(func), first_line(node.body[0])
    indent = _indent(lines[start])
    if body_start <= node.lineno - 1 or "\f" in indent or indent != _indent(lines[body_start]):
        return None
    if lines[(func.end_lineno or func.lineno) - 1].rstrip("\r\n").endswith("\\"):
        return None
    return func


def _definitions(body: Sequence[ast.stmt], method: str) -> list:
    """Defs named ``method`` that ``edit_method`` visits: not inside other defs or classes."""
    found: list = []
    for stmt in body:
        if isinstance(stmt, _DEFS):
            if stmt.name == method:
                found.append(stmt)
        elif not isinstance(stmt, ast.ClassDef):
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.stmt):
                    found.extend(_definitions([child], method))
                elif isinstance(getattr(child, "body", None), list):  # except handlers, match cases
                    found.extend(_definitions(getattr(child, "body"), method))
    return found


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t\f"))]


def _newline(lines: list, first: int) -> str:
    """The line ending of line ``first`` (a class's own), "\\n" past the end."""
    sample = lines[first] if first < len(lines) else "\n"
    return "\r\n" if sample.endswith("\r\n") else ("\r" if sample.endswith("\r") else "\n")


def _padding(count: int, newline: str, indent: str = "") -> str:
    """``count`` lines to put before a slice so that its module's line numbers are the file's.

    One string literal spanning the lines: libcst parses it as one token,
    where as many blank lines cost ~4 us each (a class at line 3,000 of
    deepseek_v2.py: 11 ms a parse). The lines end in the class's own line
    ending, so libcst keeps the file's style for what it inserts.
    """
    if count == 0:
        return ""
    return indent + '"""' + newline * (count - 1) + '"""' + newline
