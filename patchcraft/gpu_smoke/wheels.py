"""Read SGLang source files without importing SGLang.

A source can be a wheel (``.whl`` zip) or an installed/unpacked tree (the
directory that contains the ``sglang`` package).  Wheels are fetched, as
``patchcraft fetch`` fetches them, by :func:`patchcraft.base.fetch.download_wheel`
(``pip download --no-deps`` into ``<cache>/wheels``).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Callable, Optional, Union


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
