"""Fetch an SGLang release's source: ``pip download --no-deps`` into a cache.

The wheel is kept in ``<cache>/wheels`` and its Python sources unpacked to
``<cache>/releases/<version>/sglang``. SGLang is never imported, never
installed, and never a dependency of patchcraft.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional

from patchcraft.base.cache_root import ensure_directory, root
from patchcraft.base.errors import PatchcraftError

_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")


def cache_dir() -> Path:
    """``$PATCHCRAFT_CACHE``, else ``$XDG_CACHE_HOME/patchcraft``, else ``~/.cache/patchcraft`` (:mod:`patchcraft.base.cache_root`)."""
    return root()


def find_wheel(wheels: Path, version: str) -> Path | None:
    for candidate in sorted(wheels.glob(f"sglang-{version}-*.whl")):
        return candidate
    return None


def download_wheel(version: str, wheels: Path) -> Path:
    found = find_wheel(wheels, version)
    if found:
        return found
    ensure_directory(wheels)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-q",
        "-d",
        str(wheels),
        f"sglang=={version}",
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PatchcraftError(f"cannot run pip to download sglang=={version}: {exc}") from None
    found = find_wheel(wheels, version)
    if proc.returncode != 0 or found is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise PatchcraftError(f"pip could not download sglang=={version}: {last}")
    return found


def unpack(wheel: Path, dest: Path) -> Path:
    """Unpack the ``sglang/`` Python sources of ``wheel`` into ``dest/sglang`` atomically."""
    package = dest / "sglang"
    if (package / "srt" / "models").is_dir():
        return package
    ensure_directory(dest)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest))
    try:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith("sglang/") and name.endswith(".py"):
                    archive.extract(name, staging)
        os.replace(staging / "sglang", package)
    except (OSError, zipfile.BadZipFile) as exc:
        raise PatchcraftError(f"{wheel}: cannot unpack ({exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return package


def fetch(version: str, dest: Path | None = None, on_step: Optional[Callable[[str], None]] = None) -> Path:
    """Return the package root of SGLang ``version``, downloading it if needed.

    The package lands in ``<dest>/sglang``; by default ``dest`` is
    ``<cache>/releases/<version>``. ``on_step``: called with what starts
    (``downloading the wheel``, ``unpacking``) when there is work to do; a
    release already unpacked calls nothing.
    """
    if not _VERSION.match(version):
        raise PatchcraftError(f"{version!r} is not a release version (e.g. 0.5.10)")
    release = dest if dest is not None else cache_dir() / "releases" / version
    if (release / "sglang" / "srt" / "models").is_dir():
        return release / "sglang"
    wheels = cache_dir() / "wheels"
    if on_step is not None and find_wheel(wheels, version) is None:
        on_step("pip download --no-deps")  # one pip process: no byte count to show
    wheel = download_wheel(version, wheels)
    if on_step is not None:
        on_step("unpacking")
    return unpack(wheel, release)


#: The parts of an SGLang package patchcraft reads and patches (never the whole package: it is big).
PATCHED_PARTS = (
    "srt/models",
    "srt/model_executor",
    "srt/layers/aux_hidden_states.py",
    "version.py",
    "_version.py",
    "__init__.py",
)


def copy_parts(source: Path, package: Path, parts: tuple[str, ...] = PATCHED_PARTS) -> Path:
    """Copy ``parts`` (files or folders, relative to the package root) of ``source`` into ``package``.

    Parts a release does not have are skipped; ``__pycache__`` is never copied.
    """
    for part in parts:
        src = source / part
        if src.is_dir():
            shutil.copytree(src, package / part, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        elif src.is_file():
            (package / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, package / part)
    return package
