"""The serving engines patchcraft reads: ``--engine sglang|vllm``, and which one a TARGET is.

The choice is called :class:`ServingEngine`, not ``Engine``: ``smoke
--engine`` already names what runs on CUDA (:mod:`patchcraft.commands._smoke_choices`),
and both are imported by the CLI (docs/vllm.md, "The engine option").
Light on purpose: the CLI reads it before any command is chosen.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from patchcraft.base.errors import PatchcraftError

if TYPE_CHECKING:
    from patchcraft.base.target import SglangTree
    from patchcraft.base.vllm_tree import VllmTree


class ServingEngine(str, enum.Enum):
    """``--engine``: the server whose tree is read (SGLang, the default, or vLLM)."""

    SGLANG = "sglang"
    VLLM = "vllm"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


def detect_engine(target: Optional[str], engine: Optional[ServingEngine]) -> ServingEngine:
    """``engine`` when given; else vLLM when TARGET is a vLLM tree, or when no TARGET is given and only
    ``vllm`` is installed (found without importing it); else SGLang."""
    from patchcraft.base import vllm_tree

    if engine is not None:
        return engine
    if target is not None:
        return ServingEngine.VLLM if vllm_tree.is_vllm_path(Path(target)) else ServingEngine.SGLANG
    if vllm_tree.installed_package() is not None and not _sglang_installed():
        return ServingEngine.VLLM
    return ServingEngine.SGLANG


def _sglang_installed() -> bool:
    from patchcraft.base.target import resolve_target

    try:
        resolve_target(None)
    except PatchcraftError:
        return False
    return True


def resolve_engine_target(target: Optional[str], engine: ServingEngine) -> Union["SglangTree", "VllmTree"]:
    """TARGET (or the installed package) as ``engine``'s tree; one line when it is not one."""
    if engine is ServingEngine.VLLM:
        from patchcraft.base.vllm_tree import resolve_vllm_target

        return resolve_vllm_target(target)
    from patchcraft.base.target import resolve_target

    return resolve_target(target)
