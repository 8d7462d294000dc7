"""The serving engines patchcraft reads: ``--engine sglang|vllm``, and which one a TARGET is.

The choice is called :class:`ServingEngine`, not ``Engine``: ``smoke
--engine`` already names what runs on CUDA (:mod:`patchcraft.commands._smoke_choices`),
and both are imported by the CLI (docs/vllm.md, "The engine option").
Light on purpose: the CLI reads it before any command is chosen.
"""

from __future__ import annotations

import enum
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

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


def command_interpreter(command: Sequence[str]) -> Optional[Path]:
    """The Python a server command runs: its first word when that is a Python (``/venv/bin/python``,
    ``python3.11``), or the interpreter a console script's ``#!`` line names (``/venv/bin/vllm``); None otherwise."""
    if not command:
        return None
    found = shutil.which(command[0])
    if found is None:
        return None
    path = Path(found)
    if re.fullmatch(r"python(\d+(\.\d+)?)?", path.name):
        return path
    try:
        with open(path, "rb") as handle:
            first = handle.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and Path(words[0]).name == "env" and len(words) > 1:
        which = shutil.which(words[1])
        return Path(which) if which else None
    return Path(words[0]) if words and re.fullmatch(r"python(\d+(\.\d+)?)?", Path(words[0]).name) else None


def package_of_interpreter(interpreter: Path, engine: ServingEngine) -> Optional[str]:
    """Where ``interpreter`` would import ``engine``'s package from, found without importing it (``find_spec``
    of a top-level package runs none of its code); "" when it has none; None when it is this very interpreter
    (whose install the caller finds itself) or cannot be asked."""
    try:
        if interpreter.resolve() == Path(sys.executable).resolve():
            return None
    except OSError:
        return None
    code = (
        "import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); "
        "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')"
    )
    try:  # in the environment the command itself gets (its PYTHONPATH decides what it imports)
        proc = subprocess.run([str(interpreter), "-c", code, engine.value], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None
