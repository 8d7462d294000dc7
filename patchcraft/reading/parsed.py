"""One ``ast`` parse (and one libcst parse) per source text per process, and a statements-only walk.

Planning a vLLM tree reads its ~390 model and layer files from several
readers (the class graph, the family tables, the norm dispatch, the
planners of each class), and a sweep or a test plans the pristine copy and
the patched one: before this module each reader parsed on its own and the
class graph kept 64 trees, so a vLLM 0.34 sweep of 8 classes parsed 3,016
times for 392 distinct texts. The trees are kept by their text (never by
path: a file edited on disk is a new text, a copy of a release is the same
one), least recently used first out, up to :data:`LIMIT` characters of
source: one release's model files (vLLM 0.34: 10 MB), about 350 MB of trees.

Callers never modify a tree they get here: every reader treats ``ast``
trees as read-only (libcst does the editing, on its own parse).

:func:`parse_cst` does the same for libcst, whose trees are immutable (a
transform returns a new tree and never changes the one it was given): the
method slices ``apply``, ``verify``, ``apply --check``, ``revert`` and the
harness cut out of a file are parsed once per text, not once per command and
test. libcst trees are heavier than ``ast``'s (about 25 bytes a character of
source), so fewer are kept: :data:`CST_LIMIT` characters, about 100 MB.
"""

from __future__ import annotations

import ast
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import libcst

#: Characters of source whose trees are kept (the sum of the texts' lengths).
LIMIT = 12_000_000
#: The same for libcst's trees.
CST_LIMIT = 4_000_000

_TREES: OrderedDict[str, ast.Module] = OrderedDict()
_KEPT = [0]
_LOCK = threading.Lock()


def parse_python(text: str) -> ast.Module:
    """``ast.parse(text)``, kept: the same text parsed again anywhere in the process is the same tree.

    A ``SyntaxError`` is raised as ``ast.parse`` raises it (and nothing is kept).
    """
    return _kept(_TREES, _KEPT, LIMIT, text, ast.parse)


_CST: OrderedDict[str, "libcst.Module"] = OrderedDict()
_CST_KEPT = [0]


def parse_cst(text: str) -> "libcst.Module":
    """``libcst.parse_module(text)``, kept as :func:`parse_python` keeps ``ast`` trees (up to :data:`CST_LIMIT`).

    A syntax error is raised as libcst raises it (``ParserSyntaxError``), and nothing is kept.
    """
    import libcst

    return _kept(_CST, _CST_KEPT, CST_LIMIT, text, libcst.parse_module)


def _kept(trees: OrderedDict, size: list[int], limit: int, text: str, parse: Callable[[str], Any]) -> Any:
    """``parse(text)`` from ``trees`` (kept by text, least recently used first out past ``limit`` characters)."""
    with _LOCK:
        tree = trees.get(text)
        if tree is not None:
            trees.move_to_end(text)
            return tree
    tree = parse(text)
    with _LOCK:
        if text not in trees:
            trees[text] = tree
            size[0] += len(text)
            while size[0] > limit and len(trees) > 1:
                old, _ = trees.popitem(last=False)
                size[0] -= len(old)
        return trees[text]


def kept() -> tuple[int, int]:
    """(trees, characters of source) kept now: for tests and benchmarks."""
    with _LOCK:
        return len(_TREES), _KEPT[0]


def forget() -> None:
    """Drop every kept tree, ``ast``'s and libcst's (tests; a long process that is done with a tree)."""
    with _LOCK:
        _TREES.clear()
        _KEPT[0] = 0
        _CST.clear()
        _CST_KEPT[0] = 0


def kept_cst() -> tuple[int, int]:
    """(libcst trees, characters of source) kept now."""
    with _LOCK:
        return len(_CST), _CST_KEPT[0]


#: The fields of statements (and of ``except`` handlers and ``match`` cases) that hold statements.
_BLOCKS = frozenset(("body", "orelse", "finalbody", "handlers", "cases"))


def statements(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every statement under ``nodes`` (a module's body), breadth first in ``ast.walk``'s order, but none of the
    expression nodes (most of a tree) are visited: imports and definitions are statements, so a scan for them
    finds what ``ast.walk`` finds, in the same order, for a fraction of the work. ``except`` handlers and
    ``match`` cases are yielded too (they hold statements)."""
    queue = deque(nodes)
    while queue:
        node = queue.popleft()
        yield node
        for name in node._fields:
            if name in _BLOCKS:
                block = getattr(node, name, None)
                if isinstance(block, list):
                    queue.extend(block)
