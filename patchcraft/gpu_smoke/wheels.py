"""Read SGLang source files without importing SGLang.

A source can be a wheel (``.whl`` zip) or an installed/unpacked tree (the
directory that contains the ``sglang`` package).  Wheels are fetched with
``pip download --no-deps`` into :func:`wheel_cache` (``~/.cache/patchcraft/wheels``).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Union


def wheel_cache() -> Path:
    """``<cache>/wheels``, the same place ``patchcraft fetch`` keeps wheels:
    ``$PATCHCRAFT_CACHE``, else ``$XDG_CACHE_HOME/patchcraft``, else
    ``~/.cache/patchcraft``."""
    from patchcraft.base.cache_root import root  # one resolution of the cache (no home: one line, exit 2)

    return Path(os.path.expanduser(str(root()))) / "wheels"


class WheelUnavailable(RuntimeError):
    """The wheel is not cached and could not be downloaded (e.g. offline)."""


def _candidate_dirs(extra: Iterable[Union[str, Path]] = ()) -> List[Path]:
    dirs = [Path(d) for d in extra]
    env = os.environ.get("PATCHCRAFT_SGLANG_WHEELS")
    if env:
        dirs += [Path(p) for p in env.split(os.pathsep) if p]
    dirs.append(wheel_cache())
    return dirs


def find_cached_wheel(version: str, extra_dirs: Iterable[Union[str, Path]] = ()) -> Optional[Path]:
    for d in _candidate_dirs(extra_dirs):
        hits = sorted(glob.glob(str(d / f"sglang-{version}-*.whl")))
        if hits:
            return Path(hits[0])
    return None


def fetch_sglang_wheel(version: str, *, cache_dir: Optional[Path] = None, timeout: float = 300) -> Path:
    """Return a path to the ``sglang==version`` wheel, downloading it if needed."""
    cached = find_cached_wheel(version, [cache_dir] if cache_dir else ())
    if cached:
        return cached
    from patchcraft.base.cache_root import ensure_directory

    dest = ensure_directory(Path(cache_dir or wheel_cache()))  # an unwritable cache: one line naming it
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        f"sglang=={version}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WheelUnavailable(f"pip download sglang=={version} failed: {e}") from e
    found = find_cached_wheel(version, [dest])
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise WheelUnavailable(f"pip download sglang=={version} failed: {tail[0]}")
    return found


def source_reader(source: Union[str, Path]) -> Callable[[str], Optional[str]]:
    """Return ``read(relpath) -> text or None`` for a wheel or a site dir.

    ``relpath`` is relative to the directory holding the ``sglang`` package,
    e.g. ``"sglang/srt/server_args.py"``.  ``source`` may also be the
    ``sglang`` package directory itself.
    """
    p = Path(source)
    if p.is_file() and p.suffix == ".whl":
        zf = zipfile.ZipFile(p)
        names = set(zf.namelist())

        def read_zip(rel: str) -> Optional[str]:
            if rel not in names:
                return None
            return zf.read(rel).decode("utf-8-sig")

        return read_zip
    root = p.parent if (p / "srt").is_dir() and p.name == "sglang" else p

    def read_dir(rel: str) -> Optional[str]:
        f = root / rel
        if not f.is_file():
            return None
        return f.read_bytes().decode("utf-8-sig")

    return read_dir


def wheel_version(path: Union[str, Path]) -> str:
    return Path(path).name.split("-")[1]
