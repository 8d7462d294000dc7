"""The sha256 of files, remembered by their ``lstat`` between runs, as git's index remembers them.

A warm ``patchcraft run`` reads about 1,700 files before it serves: every
input of the result-cache key, every file of the overlay against its
manifest, every input of the stored preflight verdict. Hashing them all is
most of what a warm run adds to a launch. :func:`sha256` returns the digest
remembered for a file whose (size, mtime_ns, ctime_ns, inode, device) is
what it was when it was hashed, and hashes it otherwise.

Why that is enough:

- Any write to a file changes its ctime, and no call of an unprivileged
  user sets a ctime back (``os.utime`` sets mtime and atime and moves ctime
  to now), so a file rewritten with its old size and mtime restored is
  still hashed again; so is one replaced by a rename (a new inode).
- A file whose mtime or ctime is within :data:`RACY_NS` of the moment it
  was hashed is not remembered: on a filesystem with coarse timestamps a
  second write in the same tick would keep its stat (git's "racily clean"
  rule).
- The memo is read only when this user owns it and neither group nor
  others can write it (a shared ``PATCHCRAFT_CACHE`` cannot plant a digest
  that would make a damaged overlay look intact). Anything unreadable,
  foreign or malformed is an empty memo; a memo that cannot be written is
  no error. ``PATCHCRAFT_NO_CACHE=1`` turns it off.

The overlay's bootstrap still hashes every served file at import
(:mod:`patchcraft.overlay.bootstrap`); this memo only spares patchcraft's
own checks before a launch.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
import tempfile
import time
from pathlib import Path

from patchcraft.base.cache_root import ensure_directory, remove_quietly, root
from patchcraft.base.errors import PatchcraftError

#: Bump when the memo's format changes.
FORMAT = 1
#: A file touched this recently before it was hashed is not remembered (2 s: FAT's mtime tick).
RACY_NS = 2_000_000_000

_Stamp = tuple[int, int, int, int, int]

#: More entries than this and the memo keeps only those this process used.
LIMIT = 10_000

_memo: dict[str, tuple[_Stamp, str]] | None = None
_used: set[str] = set()
_dirty = False


def enabled() -> bool:
    return os.environ.get("PATCHCRAFT_NO_CACHE", "") in ("", "0")


def store_path() -> Path:
    """``<cache>/digests/<uid>.marshal``: one memo per user (marshal: read in a millisecond)."""
    return root() / "digests" / f"{os.getuid()}.marshal"


def sha256(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of the bytes of ``path``; OSError as ``open`` raises it."""
    global _dirty
    name = os.fspath(path)
    memo = _load()
    _used.add(name)
    known = memo.get(name)
    if known is not None:
        info = os.stat(name)
        if known[0] == (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev):
            return known[1]
    with open(name, "rb") as handle:  # the stamp is taken from what is read
        info = os.fstat(handle.fileno())
        stamp = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)
        digest = hashlib.sha256(handle.read()).hexdigest()
    if stat.S_ISREG(info.st_mode) and time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > RACY_NS:
        memo[name] = (stamp, digest)
        _dirty = True
    elif known is not None:
        del memo[name]
        _dirty = True
    return digest


def save() -> None:
    """Write the memo if this process learnt a digest (atomically; every failure is ignored)."""
    global _dirty
    if not _dirty or _memo is None or not enabled():
        return
    _dirty = False
    if len(_memo) > LIMIT:
        for name in set(_memo) - _used:
            del _memo[name]
    try:
        path = store_path()
        ensure_directory(path.parent, private=True)
        handle, tmp = tempfile.mkstemp(prefix=".digests.", dir=path.parent)  # mode 0600
    except (PatchcraftError, OSError):
        return
    try:
        with os.fdopen(handle, "wb") as out:
            marshal.dump({"format": FORMAT, "files": _memo}, out)
        os.replace(tmp, path)
    except (OSError, ValueError):
        remove_quietly(Path(tmp))


def forget() -> None:
    """Drop what this process remembers (tests; the stored memo is untouched)."""
    global _memo, _dirty
    _memo, _dirty = None, False
    _used.clear()


def _load() -> dict[str, tuple[_Stamp, str]]:
    global _memo
    if _memo is None:
        _memo = _read() if enabled() else {}
    return _memo


def _read() -> dict[str, tuple[_Stamp, str]]:
    try:
        with open(store_path(), "rb") as handle:
            info = os.fstat(handle.fileno())
            if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return {}  # only ever trust our own
            data = marshal.loads(handle.read())
    except (PatchcraftError, OSError, ValueError, EOFError, TypeError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
        return {}
    memo: dict[str, tuple[_Stamp, str]] = data["files"]
    if not all(isinstance(row, tuple) and len(row) == 2 and isinstance(row[1], str) for row in memo.values()):
        return {}
    return memo
