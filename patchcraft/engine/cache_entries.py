"""One stored entry of a verdict cache, read and written the one way every such cache does it.

The preflight cache (``run``'s ok verdicts), the verdict cache (``explain``
and ``check-draft``) and the harness-run cache (``harness.run_cache``) each
keep JSON entries whose answer replaces work: an entry someone else could
have written, or one damaged on disk, must never answer. So an entry is:

- **written** atomically (a temporary file renamed over the name), mode
  0600, in a folder created mode 0700, carrying the sha256 of its own body;
- **read** only when this user owns the file and no one else can write it,
  the sha256 it carries matches its body, its ``format`` is the reader's and
  its ``key`` (when the reader names one) is the one asked for. An entry
  failing any of these is removed (computed again and stored anew) and
  never used.

Nothing in an entry runs: it is JSON, and its reader checks its shape.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, Optional

from patchcraft.base.cache_root import ensure_directory, keep_newest, remove_quietly
from patchcraft.base.errors import PatchcraftError


def body_digest(entry: dict) -> str:
    """The sha256 of ``entry`` without its own ``sha256`` field (keys sorted)."""
    body = {name: value for name, value in entry.items() if name != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8", "surrogateescape")).hexdigest()


def read_entry(path: Path, fmt: int, lookup: Optional[str] = None) -> Optional[dict]:
    """The entry at ``path`` when it is ours, intact, of format ``fmt`` and (given ``lookup``) of that key; else None."""
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return None  # another user's entry would answer for them: only ever trust our own
            data = handle.read()
    except OSError:
        return None
    try:
        entry = json.loads(data)
        intact = isinstance(entry, dict) and entry.get("sha256") == body_digest(entry)
    except (ValueError, TypeError):
        intact = False
    if not intact or entry.get("format") != fmt or (lookup is not None and entry.get("key") != lookup):
        remove_quietly(path)  # damaged, or another key's: computed again and stored anew
        return None
    return entry


def entry_in(folder: Callable[[], Path], lookup: str, fmt: int) -> Optional[tuple[Path, dict]]:
    """The entry named ``lookup`` in the cache folder ``folder()`` (see :func:`read_entry`), with its path; None
    when there is none, it may not be used, or the cache has no folder (no home directory)."""
    try:
        path = folder() / f"{lookup}.json"
    except PatchcraftError:
        return None
    entry = read_entry(path, fmt, lookup)
    return None if entry is None else (path, entry)


def used(path: Path) -> None:
    """Mark ``path`` recently used (kept by ``keep_newest``)."""
    try:
        os.utime(path)
    except OSError:
        pass


def write_entry(folder: Path, name: str, entry: dict, keep: int) -> None:
    """``entry``, its sha256 added, as ``folder/name.json`` (atomically, mode 0600); keep the ``keep`` newest.

    Failures are ignored: a cache that cannot be written only costs the next run its time.
    """
    entry = dict(entry)
    entry["sha256"] = body_digest(entry)
    try:
        where = ensure_directory(folder, private=True)
        handle, tmp = tempfile.mkstemp(prefix=".entry.", dir=where)  # mode 0600
    except (PatchcraftError, OSError):
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(entry, out)
        os.replace(tmp, where / f"{name}.json")
    except (OSError, TypeError, ValueError):
        remove_quietly(Path(tmp))
        return
    keep_newest(where, "*.json", keep)
