"""Kimi-K3's attention residuals: a config switch the harness runs one side of, and says which.

Kimi-K3 (vLLM's ``vllm/models/kimi_k3/<platform>/``) has two forwards in one,
chosen by ``config.attn_res_block_size``:

- ``None``: a residual stream like every other target. The layer call threads
  ``(hidden_states, residual)``, id 0 is the embedding output, id ``k`` is
  ``hidden_states + residual`` after layer ``k - 1``.
- set: attention residuals. Every ``attn_res_block_size`` layers the running
  state is written to a bank of block states (``residual`` becomes that
  bank), and each layer's input is a learned mix of the bank and the running
  prefix sum (``attn_res``). A capture there reads the prefix sum of the
  current block (or, with ``VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1`` on NVIDIA,
  the mixed stream), which is not the residual stream of the first path.

The harness's config gave ``Nothing`` for the field. NVIDIA's module derives
``self.use_attn_res`` from it in ``__init__`` (which the harness does not run),
so it took the first path without saying so. The ROCm module tests
``self.config.attn_res_block_size is None`` in its forward, so it took the
second and failed on the block count. Now both run the first path on purpose:
the config says ``None``, and the attributes ``__init__`` derives from it are
computed from that ``None`` (:func:`derived`). The answer carries
:func:`condition`, which names the path that ran and the one that did not.
"""

from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import Any

from patchcraft.harness.switches import ATTENTION_RESIDUALS, reads_config
from patchcraft.reading.class_graph import ClassNode, ModelGraph

#: The config field that switches attention residuals on (``None``: off).
FIELD = ATTENTION_RESIDUALS.field


def reads_switch(graph: ModelGraph, inner: ClassNode) -> bool:
    """Whether a method of ``inner``'s classes reads ``config.attn_res_block_size`` (or ``self.config.``...): a
    switch of the checkpoint's config, not an attribute of the model's own (AliceAI's ``self.attn_res_block_size``,
    always on, is no switch)."""
    return reads_config((m for node in graph.mro(inner) for m in node.methods.values()), FIELD)


def derived(graph: ModelGraph, inner: ClassNode, config: Any, start: int, end: int) -> dict[str, Any]:
    """``self.X = <expression of the field>`` in the ``__init__`` of ``inner``'s classes, evaluated in order
    with the field ``None`` (``self.use_attn_res = self.attn_res_block_size is not None``: False).

    An expression naming anything but ``config``, ``self``'s attributes computed so far and ``cdiv`` is
    left out, so the forward reads what it would read without this module (a stand-in)."""
    found: dict[str, Any] = {}
    known = {"start_layer": start, "end_layer": end}
    names = {"config": config, "cdiv": lambda a, b: -(-a // b)}
    for node in reversed(graph.mro(inner)):  # a subclass's assignment wins
        init = node.methods.get("__init__")
        for target, value in _self_assignments(init):
            if not _mentions(value, {FIELD} | set(found)):
                continue
            try:
                result = eval(  # an expression of the release's own __init__, on plain values
                    compile(ast.Expression(value), "<init>", "eval"),
                    {"__builtins__": {}},
                    {**names, "self": SimpleNamespace(**known, **found)},
                )
            except Exception:  # noqa: BLE001 - an expression this cannot evaluate is left to the stand-ins
                continue
            found[target] = result
    return found


def condition() -> str:
    """What the run assumed, and what it leaves unshown."""
    return ATTENTION_RESIDUALS.condition()


def _self_assignments(init: Any) -> list[tuple[str, ast.expr]]:
    """``(attribute, value)`` of each ``self.X = value`` / ``self.X: T = value`` in source order."""
    if init is None:
        return []
    found: list[tuple[int, str, ast.expr]] = []
    for stmt in ast.walk(init):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            found.append((stmt.lineno, target.attr, value))
    return [(attr, value) for _, attr, value in sorted(found, key=lambda f: f[0])]


def _mentions(value: ast.expr, names: set[str]) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in names for n in ast.walk(value))
