"""Definite assignment in one function: is a local name bound at a point, on every path or on some path.

Generic and pure (libcst nodes in, a bool out); ``capture_embedding_output``
asks it whether ``residual`` may be read where the embedding capture goes
(0.5.12 Gemma4 binds it only inside the layer loop) and whether a
statement rebinds ``hidden_states``. A point is a chain of
``(block, position)`` from the function body down, as
:func:`~patchcraft.transforms._base.walk_statements` gives it: the
statements before ``position`` in each block run before the point.

Only plain and annotated assignments bind (``x = ...``, ``x: T = ...``,
unpacking included); loops may run zero times, so they never bind on every
path, and ``match`` is not entered.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from patchcraft.transforms._base import iter_nodes


def bound_on_every_path(func: cst.FunctionDef, point: Sequence, name: str) -> bool:
    """Whether local ``name`` is bound on every path that reaches ``point`` (definite assignment).

    ``point`` is a chain of ``(block, position)`` from the function body down
    (see ``walk_statements``): the statements before ``position`` in each
    block run before the point. Being assigned somewhere in the function is
    not enough: a name bound only inside a loop, or in one branch of an
    ``if``, may be unbound there.
    """
    params = [p.name.value for p in (*func.params.posonly_params, *func.params.params, *func.params.kwonly_params)]
    if name in params:
        return True
    return any(binds(stmt, name) for block_node, position in point for stmt in block_node.body[:position])


def bound_on_some_path(func: cst.FunctionDef, point: Sequence, name: str) -> bool:
    """Whether some statement before ``point`` (or a parameter) binds local ``name``."""
    params = [p.name.value for p in (*func.params.posonly_params, *func.params.params, *func.params.kwonly_params)]
    return name in params or any(
        _targets_name(node, name)
        for block_node, position in point
        for stmt in block_node.body[:position]
        for node in iter_nodes(stmt)
        if isinstance(node, cst.BaseSmallStatement)
    )


def binds(stmt: cst.CSTNode, name: str) -> bool:
    """Whether running ``stmt`` to its end always binds ``name`` (loops may run zero times)."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return any(_targets_name(small, name) for small in stmt.body)
    if isinstance(stmt, cst.If):
        return (
            _block_binds(stmt.body, name)
            and stmt.orelse is not None
            and (binds(stmt.orelse, name) if isinstance(stmt.orelse, cst.If) else _block_binds(stmt.orelse.body, name))
        )
    if isinstance(stmt, cst.With):
        return _block_binds(stmt.body, name)
    if isinstance(stmt, cst.Try):
        if stmt.finalbody is not None and _block_binds(stmt.finalbody.body, name):
            return True
        return _block_binds(stmt.body, name) and all(_block_binds(h.body, name) for h in stmt.handlers)
    return False


def _block_binds(block_node: cst.BaseSuite, name: str) -> bool:
    if isinstance(block_node, cst.IndentedBlock):
        return any(binds(stmt, name) for stmt in block_node.body)
    return isinstance(block_node, cst.SimpleStatementSuite) and any(
        _targets_name(small, name) for small in block_node.body
    )


def _targets_name(small: cst.BaseSmallStatement, name: str) -> bool:
    if isinstance(small, cst.Assign):
        return any(_names_in_target(t.target, name) for t in small.targets)
    if isinstance(small, cst.AnnAssign):
        return small.value is not None and _names_in_target(small.target, name)
    return False


def _names_in_target(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_names_in_target(e.value, name) for e in target.elements)
    if isinstance(target, cst.StarredElement):
        return _names_in_target(target.value, name)
    return False
