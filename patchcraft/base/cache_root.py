"""Where patchcraft's cache lives, and the one place that creates its directories.

The cache root is ``$PATCHCRAFT_CACHE``, else ``$XDG_CACHE_HOME/patchcraft``,
else ``~/.cache/patchcraft``. Every directory patchcraft writes into (fetched
wheels and releases, overlays, the run-result and preflight caches) is made
ready by :func:`ensure_directory`, so that every way a cache can be unusable
(a read-only mount, ``/proc``, a directory another user owns, no home
directory at all: HOME unset and a uid with no passwd entry, as on
OpenShift) is one :class:`PatchcraftError` naming the path and
``PATCHCRAFT_CACHE``: one line, exit 2, never a traceback.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from patchcraft.base.errors import PatchcraftError

#: What every cache error ends with: the way out.
HINT = "set PATCHCRAFT_CACHE to a directory this user can write"


def root() -> Path:
    """``$PATCHCRAFT_CACHE``, else ``$XDG_CACHE_HOME/patchcraft``, else ``~/.cache/patchcraft``."""
    if os.environ.get("PATCHCRAFT_CACHE"):
        return Path(os.environ["PATCHCRAFT_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "patchcraft"
    return _home() / ".cache" / "patchcraft"


def _home() -> Path:
    """The home directory, or a PatchcraftError when there is none (an empty HOME counts as unset)."""
    if os.environ.get("HOME"):
        return Path(os.environ["HOME"])
    try:
        import pwd

        home = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        home = ""
    if not home:
        raise PatchcraftError(
            f"~/.cache/patchcraft: cannot place the patchcraft cache: HOME is not set and uid {os.getuid()} "
            f"has no home directory (no passwd entry); {HINT}"
        )
    return Path(home)


def ensure_directory(path: Path, private: bool = False) -> Path:
    """Create ``path`` (and its parents) and prove it writable by writing into it; return it.

    ``private`` creates the last component mode 0700 (caches whose entries
    only their owner may trust).

    A failure is a PatchcraftError naming the path; the hint names
    ``PATCHCRAFT_CACHE`` when the path is inside the cache. ``os.access`` is
    not enough: root passes it on a directory it cannot write (a read-only
    mount), so a real file is created and removed.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700 if private else 0o777, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise PatchcraftError(f"{path}: cannot write there ({exc.strerror or exc}); {_hint(path)}") from None
    return path


def _hint(path: Path) -> str:
    try:
        inside = path.resolve().is_relative_to(root().resolve())
    except (PatchcraftError, OSError, ValueError):
        inside = False
    return f"the patchcraft cache is {root()}: {HINT}" if inside else "choose a directory this user can write"


def keep_newest(folder: Path, pattern: str, keep: int) -> None:
    """Remove all but the ``keep`` most recently used files matching ``pattern`` in ``folder`` (best effort)."""
    entries = []
    for path in folder.glob(pattern):
        try:
            entries.append((path.stat().st_mtime, path))
        except OSError:
            continue
    for _, path in sorted(entries, reverse=True)[keep:]:
        remove_quietly(path)


def remove_quietly(path: Path) -> None:
    """Unlink ``path``; a cache entry that is already gone or cannot be removed is no error."""
    try:
        path.unlink()
    except OSError:
        pass
