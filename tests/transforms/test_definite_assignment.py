"""transforms/_definite_assignment.py on its own: is a name bound at a point, on every path or on some.

Each case is a function whose statement calling ``point()`` marks the point
asked about (the point is right before that statement); pure (libcst in, bool out), no transform involved.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from patchcraft.transforms._base import walk_statements
from patchcraft.transforms._definite_assignment import binds, bound_on_every_path, bound_on_some_path


def _at_point(code: str) -> tuple[cst.FunctionDef, tuple]:
    func = cst.parse_module(textwrap.dedent(code)).body[0]
    assert isinstance(func, cst.FunctionDef)
    marked = [
        chain
        for stmt, chain in walk_statements(func)
        if isinstance(stmt, cst.SimpleStatementLine) and "point()" in cst.Module(body=()).code_for_node(stmt)
    ]
    [chain] = marked
    return func, chain


#: (code, bound on every path, bound on some path) for the name ``x``.
CASES = {
    "a parameter": ("def f(x):\n    point()\n", True, True),
    "a keyword-only parameter": ("def f(*, x):\n    point()\n", True, True),
    "assigned before": ("def f():\n    x = 1\n    point()\n", True, True),
    "by the statement at the point (not yet run)": ("def f():\n    x = point()\n", False, False),
    "assigned after": ("def f():\n    point()\n    x = 1\n", False, False),
    "never assigned": ("def f():\n    y = 1\n    point()\n", False, False),
    "unpacked from a tuple": ("def f():\n    a, (b, x) = g()\n    point()\n", True, True),
    "starred in an unpacking": ("def f():\n    a, *x = g()\n    point()\n", True, True),
    "a chained assignment": ("def f():\n    a = x = 1\n    point()\n", True, True),
    "annotated with a value": ("def f():\n    x: int = 1\n    point()\n", True, True),
    "annotated without a value": ("def f():\n    x: int\n    point()\n", False, False),
    "an attribute, not the name": ("def f(self):\n    self.x = 1\n    point()\n", False, False),
    "only inside a loop (may run zero times)": (
        "def f(n):\n    for i in n:\n        x = i\n    point()\n",
        False,
        True,
    ),
    "only inside a while": ("def f():\n    while g():\n        x = 1\n    point()\n", False, True),
    "in an if without else": ("def f(c):\n    if c:\n        x = 1\n    point()\n", False, True),
    "in both branches": ("def f(c):\n    if c:\n        x = 1\n    else:\n        x = 2\n    point()\n", True, True),
    "in if, elif and else": (
        "def f(c, d):\n    if c:\n        x = 1\n    elif d:\n        x = 2\n    else:\n        x = 3\n    point()\n",
        True,
        True,
    ),
    "in if and elif, no else": (
        "def f(c, d):\n    if c:\n        x = 1\n    elif d:\n        x = 2\n    point()\n",
        False,
        True,
    ),
    "in one-line branches": ("def f(c):\n    if c: x = 1\n    else: x = 2\n    point()\n", True, True),
    "in a with body": ("def f():\n    with g():\n        x = 1\n    point()\n", True, True),
    "in try and every handler": (
        "def f():\n    try:\n        x = 1\n    except ValueError:\n        x = 2\n    point()\n",
        True,
        True,
    ),
    "in try but not its handler": (
        "def f():\n    try:\n        x = 1\n    except ValueError:\n        pass\n    point()\n",
        False,
        True,
    ),
    "in a finally": ("def f():\n    try:\n        g()\n    finally:\n        x = 1\n    point()\n", True, True),
    "in an enclosing block, before the point's branch": (
        "def f(c):\n    x = 1\n    if c:\n        point()\n",
        True,
        True,
    ),
    "earlier in the point's own branch": ("def f(c):\n    if c:\n        x = 1\n        point()\n", True, True),
    "in a sibling branch only": ("def f(c):\n    if c:\n        x = 1\n    else:\n        point()\n", False, False),
    "in the loop holding the point, after it": (
        "def f(n):\n    for i in n:\n        point()\n        x = i\n",
        False,
        False,
    ),
}


@pytest.mark.parametrize("code,every,some", CASES.values(), ids=list(CASES))
def test_bound_at_the_point(code: str, every: bool, some: bool) -> None:
    func, point = _at_point(code)
    assert bound_on_every_path(func, point, "x") is every
    assert bound_on_some_path(func, point, "x") is some


@pytest.mark.parametrize(
    "statement,expected",
    [
        ("x = 1", True),
        ("x += 1", False),  # rebinding needs x bound already: not an assignment that binds it
        ("y = x", False),
        ("if c:\n    x = 1\nelse:\n    x = 2", True),
        ("if c:\n    x = 1", False),
        ("for x in y:\n    pass", False),  # a for target is not counted: the loop may run zero times
    ],
)
def test_binds_a_statement(statement: str, expected: bool) -> None:
    assert binds(cst.parse_statement(statement + "\n"), "x") is expected
