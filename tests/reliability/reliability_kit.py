"""Helpers shared by the reliability tests and scripts/reliability_report.py.

Trees are real releases copied with ``tests/conftest.copy_release``;
"reduced" trees keep a few real model files of one release so that a
whole-tree ``apply`` takes a fraction of a second (the crash test runs it
hundreds of times).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Iterable, Mapping

from patchcraft.base.tree_lock import LOCK_NAME
from patchcraft.base.sources import is_temp_name, stale_temp_files

TESTS = Path(__file__).resolve().parent.parent
#: Where tests store their figures (JSON, one file per experiment) when set.
FIGURES_ENV = "PATCHCRAFT_RELIABILITY_FIGURES"


def _tests_conftest() -> ModuleType:
    """tests/conftest.py, whichever conftest pytest last put in sys.modules."""
    loaded = sys.modules.get("conftest")
    if loaded is not None and hasattr(loaded, "copy_release"):
        return loaded
    spec = importlib.util.spec_from_file_location("patchcraft_tests_conftest", TESTS / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


copy_release = _tests_conftest().copy_release


def record(name: str, values: Mapping) -> None:
    """Keep one experiment's figures for scripts/reliability_report.py."""
    directory = os.environ.get(FIGURES_ENV)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(json.dumps(values, indent=2, sort_keys=True, default=str) + "\n")


#: The release matrix the project supports.
from patchcraft.base.releases import MATRIX  # noqa: E402  (the one list: patchcraft/base/releases.py)

MODEL_DIR = Path("srt") / "models"
#: Root ignores file modes; without these capabilities it obeys them like any other user.
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner,-linux_immutable", "--"]


def reduced_release(version: str, dest: Path, keep: Iterable[str], executor: bool = True) -> Path:
    """A copy of ``version`` whose models directory holds only the files in ``keep``.

    ``executor=False`` also leaves out ``srt/model_executor`` (its big runner
    files take most of an apply's time; they are written the same way).
    """
    package = copy_release(version, dest)
    if not executor:
        shutil.rmtree(package / "srt" / "model_executor", ignore_errors=True)
    wanted = set(keep)
    for entry in (package / MODEL_DIR).iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        elif entry.stem not in wanted:
            entry.unlink()
    missing = wanted - {p.stem for p in (package / MODEL_DIR).glob("*.py")}
    assert not missing, f"{version} has no {sorted(missing)}"
    return package


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (bytecode caches excluded), by relative path."""
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def restore(root: Path, state: Mapping[str, bytes]) -> None:
    """Make the files under ``root`` exactly ``state`` (cheap: only what differs)."""
    current = snapshot(root)
    for rel in set(current) - set(state):
        (root / rel).unlink()
    for rel, data in state.items():
        if current.get(rel) != data:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)


def is_junk(rel: str) -> str | None:
    """``"temp"`` for a killed run's temporary file, ``"lock"`` for its lock file."""
    name = rel.rsplit("/", 1)[-1]
    if name == LOCK_NAME:
        return "lock"
    if is_temp_name(name):
        return "temp"
    return None


@dataclass
class TreeState:
    """How every file of a tree compares with its original and fully patched bytes."""

    original: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    neither: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    temp: int = 0
    lock: int = 0

    @property
    def lost(self) -> int:
        return len(self.neither) + len(self.missing)

    def signature(self) -> tuple:
        return (tuple(sorted(self.patched)), self.temp > 0, self.lock > 0)


def compare(root: Path, original: Mapping[str, bytes], patched: Mapping[str, bytes]) -> TreeState:
    """Classify every file: original, patched, neither (torn, foreign) or missing."""
    state = TreeState()
    current = snapshot(root)
    for rel, data in current.items():
        junk = is_junk(rel)
        if junk == "temp":
            state.temp += 1
        elif junk == "lock":
            state.lock += 1
        elif rel not in original:
            state.neither.append(rel)
        elif data == patched[rel] and data != original[rel]:
            state.patched.append(rel)
        elif data == original[rel]:
            state.original.append(rel)
        else:
            state.neither.append(rel)
    state.missing = sorted(set(original) - set(current))
    return state


def temp_files(directory: Path) -> list[Path]:
    return stale_temp_files(directory)


def patchcraft_cli(
    *args: str, obey_modes: bool = False, env: Mapping[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run the real command line, as a user would."""
    command = [sys.executable, "-m", "patchcraft", *args]
    if obey_modes:
        command = [*NO_DAC, *command]
    environment = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=timeout)


_TMP = re.compile(r"/\S*?/pytest-of-[^/]+/pytest-\d+/[^/\s]+")


def scrub(text: str) -> str:
    """``text`` with the test's temporary directories shown as ``<tmp>``."""
    return _TMP.sub("<tmp>", text)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("patchcraft: error:")]
