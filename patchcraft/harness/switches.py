"""Config switches a forward reads that the harness runs one side of, and how each side is said (no torch here).

Some targets are two models in one file, told apart by a field of the
checkpoint's config: Kimi-K3's ``attn_res_block_size`` (attention residuals
or not, :mod:`patchcraft.harness.attention_residuals`) and GLM-5-Next's
``mhc`` (hyper-connection layers or not, :mod:`patchcraft.harness.hyper_connections`).
The harness runs one side. ``explain`` says which in a note
(:meth:`Switch.condition`), and ``check-draft`` compares the value with the
target's ``config.json`` (:meth:`Switch.side_of`): a target on the other side
fails, because what it feeds the draft is not shown.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

#: The field of a config that is absent (check-draft reads the target's config.json).
ABSENT = object()


@dataclass(frozen=True)
class Switch:
    field: str
    #: The value the harness runs.
    ran: Any
    #: The side that runs, and the side that does not, in words.
    side: str
    other: str
    #: Whether a config without the field runs the harness's side (the model reads it with a default of ``ran``).
    unset_is_ran: bool

    def condition(self) -> str:
        return (
            f"run with config.{self.field} = {self.ran!r} ({self.side}): a checkpoint with another value runs "
            f"{self.other}, which the harness does not model; what that side feeds the draft is not shown"
        )

    def side_of(self, fields: Mapping[str, Any]) -> Optional[bool]:
        """Whether a config with ``fields`` runs the harness's side (None: the config does not say)."""
        value = fields.get(self.field, ABSENT)
        if value is ABSENT:
            return True if self.unset_is_ran else None
        return value == self.ran if self.ran is not None else value is None


ATTENTION_RESIDUALS = Switch(
    "attn_res_block_size",
    None,
    "no attention residuals",
    "the attention-residual path (block states mixed by attn_res)",
    unset_is_ran=True,
)
HYPER_CONNECTIONS = Switch(
    "mhc",
    True,
    "mHC layers: hyper-connection streams",
    "layers without hyper-connections (GLM-5-Next's 70B model)",
    unset_is_ran=False,
)
SWITCHES = (ATTENTION_RESIDUALS, HYPER_CONNECTIONS)
_FIELD = re.compile(r"run with config\.(\w+) = ")


def named_in(condition: str) -> Optional[Switch]:
    """The switch a :meth:`Switch.condition` text (or a note quoting it) is about."""
    found = _FIELD.search(condition)
    return next((s for s in SWITCHES if found and s.field == found.group(1)), None)


def reads_config(methods: Iterable[ast.AST], field: str) -> bool:
    """Whether one of ``methods`` reads ``config.<field>`` or ``self.config.<field>`` (the checkpoint's config, not
    an attribute of the model's own of the same name)."""
    return any(
        isinstance(n, ast.Attribute) and n.attr == field and _is_config(n.value)
        for method in methods
        for n in ast.walk(method)
    )


def _is_config(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "config") or (
        isinstance(node, ast.Attribute) and node.attr == "config"
    )
