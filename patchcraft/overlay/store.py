"""Where overlays live: versions behind a link, swapped atomically, never removed while in use.

An overlay path (``overlay build --out DIR``, or ``<cache>/overlays/<key>``)
is a symbolic link to a version directory beside it, ``.<name>-<random>``.
A build writes a new version next to the old one and then replaces the link
with one ``rename``: a process starting at any moment finds either the old
overlay or the new one, both complete, never a half-written or missing one.
A ``DIR`` that is a real directory (built by an older patchcraft) is swapped
for the link with ``renameat2(RENAME_EXCHANGE)``, just as atomic.

"In use" is a lock: every process whose bootstrap ran holds a shared
``flock`` on its version's :data:`~patchcraft.overlay.bootstrap.LOCK` file
(``patchcraft run`` takes it before ``exec``, so there is no gap), and a
builder holds it while it writes. A version is removed only by whoever gets
the exclusive lock without waiting. Overlays without a lock file (older
patchcraft) count as in use while a process has them on ``PYTHONPATH``
(``/proc/PID/environ``, for the processes this user may read).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

from patchcraft.base.errors import PatchcraftError
from patchcraft.overlay.bootstrap import LOCK, MANIFEST

#: Temp directories of older patchcraft builds (no lock file): removed once older than this.
STALE_AFTER_S = 3600
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def new_version(path: Path) -> tuple[Path, int]:
    """A fresh version directory beside ``path`` (mode 755), locked exclusively by the caller: (directory, lock fd)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    version = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    os.chmod(version, 0o755)
    lock = version / LOCK
    lock.touch()
    os.chmod(lock, 0o644)
    fd = os.open(lock, os.O_RDONLY)
    _flock(fd, exclusive=True)
    return version, fd


def share(fd: int) -> None:
    """Turn the builder's exclusive lock into a shared one: the version is complete, still held (across exec too)."""
    _flock(fd, exclusive=False)
    os.set_inheritable(fd, True)


def discard(version: Path, fd: int) -> None:
    """Remove a version this process was building (it holds the exclusive lock)."""
    shutil.rmtree(version, ignore_errors=True)
    os.close(fd)


def hold(version: Path) -> int | None:
    """A shared lock on ``version``, inherited across ``exec`` (the server keeps it); None if it is being removed or has no lock."""
    fd = _try_lock(version / LOCK, exclusive=False)
    if fd is not None:
        os.set_inheritable(fd, True)
    return fd


def _try_lock(lock: Path, exclusive: bool) -> int | None:
    """An open descriptor of ``lock`` holding the flock, or None when it cannot be opened or is held."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        _flock(fd, exclusive=exclusive)
    except OSError:
        os.close(fd)
        return None
    return fd


def _flock(fd: int, exclusive: bool) -> None:
    import fcntl

    fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)


def point(path: Path, version: Path) -> None:
    """Make ``path`` a link to ``version`` (a sibling) in one atomic step."""
    link = path.parent / f".{path.name}-link-{os.getpid()}-{time.monotonic_ns()}"
    os.symlink(version.name, link)  # relative: the overlay moves with its directory (an image's COPY)
    try:
        if path.is_symlink() or not path.exists():
            os.replace(link, path)
            return
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()  # an empty directory (mkdir'd ahead): nothing can be using it
            os.replace(link, path)
            return
        if not (path / MANIFEST).is_file():  # never swap away a directory that is not an overlay (a mistyped --out)
            raise PatchcraftError(f"{path}: exists and is not an overlay; choose another --out, or remove it")
        _exchange(link, path)  # the old real directory is now at `link`: keep it as an old version
        os.replace(link, path.parent / f".{path.name}-old{time.monotonic_ns()}")
    except BaseException:
        if link.is_symlink():
            link.unlink()
        raise


def _exchange(a: Path, b: Path) -> None:
    """Swap two directory entries atomically (Linux renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None or renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno() if renameat2 is not None else errno.ENOSYS
        raise PatchcraftError(
            f"{b}: a directory that cannot be replaced atomically here ({os.strerror(code)}); "
            "remove it while no server uses it, or build into another --out"
        )


def target(path: Path) -> Path | None:
    """The version ``path`` links to, or ``path`` itself when it is a real overlay directory; None if neither."""
    if path.is_symlink():
        resolved = path.resolve()
        return resolved if resolved.is_dir() else None
    return path if (path / MANIFEST).is_file() else None


def versions(parent: Path, name: str) -> list[Path]:
    """The version and temp directories of overlay ``name`` in ``parent``, oldest first."""
    try:
        found = [p for p in parent.iterdir() if p.name.startswith(f".{name}-") and not p.is_symlink() and p.is_dir()]
    except OSError:
        return []
    return sorted(found, key=_mtime)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def remove_unused(parent: Path, name: str, keep_previous: bool = True) -> list[Path]:
    """Remove the versions of ``name`` nobody holds and no link points to; return them.

    ``keep_previous`` spares the newest complete one: a process that found it
    an instant before the link moved may not hold its lock yet.
    """
    current = target(parent / name)
    candidates = [v for v in versions(parent, name) if current is None or v.resolve() != current.resolve()]
    complete = [v for v in candidates if (v / MANIFEST).is_file()]
    if keep_previous and complete:
        candidates.remove(complete[-1])
    return [v for v in candidates if remove_if_unused(v)]


def remove_if_unused(version: Path, link: Path | None = None) -> bool:
    """Remove ``version`` (and ``link``, if it still points there) if no process holds it.

    Without a lock file (an older patchcraft's), "held" means on the
    ``PYTHONPATH`` of a process this user can read, or written within
    :data:`STALE_AFTER_S` (a build may still be writing it).
    """
    lock = version / LOCK
    if not lock.exists():
        if _mtime(version) > time.time() - STALE_AFTER_S or version.resolve() in on_pythonpath():
            return False
        _unlink_if_pointing(link, version)
        shutil.rmtree(version, ignore_errors=True)
        return True
    fd = _try_lock(lock, exclusive=True)
    if fd is None:
        return False
    try:  # under the exclusive lock: nobody can start using it now
        _unlink_if_pointing(link, version)
        shutil.rmtree(version, ignore_errors=True)
    finally:
        os.close(fd)
    return not version.exists()


def remove_orphans(parent: Path) -> tuple[list[Path], list[Path]]:
    """Versions and temp dirs in ``parent`` whose overlay is gone (a build killed mid-write, an entry removed by hand).

    Returns (removed, kept because held). Only for a directory of overlays
    alone (the cache's): any hidden directory there is one of ours.
    """
    try:
        entries = list(parent.iterdir())
    except OSError:
        return [], []
    names = {p.name for p in entries if not p.name.startswith(".")}
    removed: list[Path] = []
    kept: list[Path] = []
    for path in entries:
        if (
            path.name.startswith(".")
            and not path.is_symlink()
            and path.is_dir()
            and path.name[1:].rsplit("-", 1)[0] not in names
        ):
            (removed if remove_if_unused(path) else kept).append(path)
    return removed, kept


def _unlink_if_pointing(link: Path | None, version: Path) -> None:
    """Remove ``link`` first (a run then rebuilds, never finds a half-removed version), unless it moved meanwhile."""
    if link is not None and link.is_symlink() and link.resolve() == version.resolve():
        link.unlink()


def remove(path: Path) -> None:
    """Remove overlay ``path``: the link and the version it points to (for throwaway overlays)."""
    version = target(path)
    if path.is_symlink():
        path.unlink()
    if version is not None:
        shutil.rmtree(version, ignore_errors=True)


def on_pythonpath() -> set[Path]:
    """Real paths of every ``PYTHONPATH`` entry of the processes this user can read."""
    found: set[Path] = set()
    for environ in _environs():
        for entry in environ.get("PYTHONPATH", "").split(os.pathsep):
            if entry:
                try:
                    found.add(Path(entry).resolve())
                except OSError:
                    continue
    return found


def _environs() -> Iterator[dict[str, str]]:
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            data = Path("/proc", pid, "environ").read_bytes()
        except OSError:
            continue
        pairs = (item.partition(b"=") for item in data.split(b"\0") if b"=" in item)
        yield {os.fsdecode(k): os.fsdecode(v) for k, _, v in pairs}
