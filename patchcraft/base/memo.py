"""What a process computed from files, kept while those files are unchanged: the one per-process memo.

A process asks for the same reading of the same files more than once:
check-draft proves each fix by explaining again (the model runner's resets,
the harness's compiled subject), a run plans and then judges the hand edits
(vLLM's plans), the harness plans a tree for every row. Each such reading is
kept in a :class:`Memo` under its key together with the *stamp* of what it
read (:func:`stamp`): for every file its size, mtime_ns, ctime_ns, inode and
device, and for every folder the names under it. A value is handed back only
while its stamp is still what it was; otherwise it is computed again.

Why that is enough:

- Any write to a file moves its ctime, and no unprivileged call sets a ctime
  back (``os.utime`` restores mtime, never ctime), so a file rewritten with its
  old size and mtime is read again; a file replaced by a rename has a new
  inode; a file added or removed changes its folder's names.
- A stamp taken within :data:`RACY_NS` of a file's mtime or ctime is not kept
  (git's "racily clean" rule): a second write in the same clock tick would
  leave the stat as it was. File systems whose times are whole seconds (FAT,
  ext3, HFS+) get :data:`COARSE_RACY_NS`.

This is the per-process memo only; digests remembered between runs are
:mod:`patchcraft.base.digests`', and whole verdicts
:mod:`patchcraft.engine.verdict_cache`'s.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Iterable, TypeVar

V = TypeVar("V")

#: A stamp taken this soon after a file's last change is not kept (Linux's coarse clock ticks in at most 10 ms).
RACY_NS = 50_000_000
#: The same where a file's times are whole seconds (a file system that keeps no finer time).
COARSE_RACY_NS = 2_000_000_000

#: (size, mtime_ns, ctime_ns, inode, device) of a file; None when it cannot be stat'ed.
FileStamp = tuple[int, int, int, int, int] | None


def file_stamp(path: str | os.PathLike[str]) -> FileStamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


@dataclass(frozen=True)
class Stamp:
    """What a reading read, and each file's stat at the time (see the module docstring)."""

    #: Files read, by name.
    files: tuple[str, ...]
    #: Folders whose ``*.py`` files were read, each ``(folder, recursive)``: their names count too.
    folders: tuple[tuple[str, bool], ...]
    #: The stats, in the order above (a folder's: its file names and their stats).
    value: tuple
    #: False: some file changed too recently for its stat to prove it unchanged later.
    trusted: bool

    def current(self) -> bool:
        """Whether every file and folder is as stamped."""
        return _measure(self.files, self.folders)[0] == self.value


def stamp(
    files: Iterable[str | os.PathLike[str]] = (), folders: Iterable[tuple[str | os.PathLike[str], bool]] = ()
) -> Stamp:
    """The stamp of ``files`` and of the ``*.py`` files of ``folders`` (``(folder, recursive)``), taken now."""
    names = tuple(os.fspath(f) for f in files)
    where = tuple((os.fspath(folder), recursive) for folder, recursive in folders)
    value, newest, coarse = _measure(names, where)
    window = COARSE_RACY_NS if coarse else RACY_NS
    return Stamp(names, where, value, time.time_ns() - newest > window)


def _measure(files: tuple[str, ...], folders: tuple[tuple[str, bool], ...]) -> tuple[tuple, int, bool]:
    """(the stats, the newest mtime or ctime among them, whether every time is whole seconds)."""
    stats: list[object] = []
    newest, coarse = 0, True
    for name in files + tuple(name for folder, recursive in folders for name in _python_files(folder, recursive)):
        found = file_stamp(name)
        stats.append((name, found))
        if found is not None:
            newest = max(newest, found[1], found[2])
            coarse = coarse and found[1] % 1_000_000_000 == 0 and found[2] % 1_000_000_000 == 0
    return tuple(stats), newest, coarse and bool(stats)


def _python_files(folder: str, recursive: bool) -> list[str]:
    """The ``*.py`` files of ``folder`` (and below it when ``recursive``), sorted; none when it is no folder."""
    found: list[str] = []
    if recursive:
        for root, dirs, names in os.walk(folder):
            dirs.sort()
            found.extend(os.path.join(root, name) for name in names if name.endswith(".py"))
        return sorted(found)
    try:
        with os.scandir(folder) as entries:
            found = [entry.path for entry in entries if entry.name.endswith(".py")]
    except OSError:
        return []
    return sorted(found)


class Memo(Generic[V]):
    """Values computed from files, each kept under its key while its :class:`Stamp` is current (newest ``keep``)."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._entries: OrderedDict[Hashable, tuple[Stamp, V]] = OrderedDict()

    def get(self, key: Hashable, read: Callable[[], Stamp], compute: Callable[[], V]) -> V:
        """The value kept for ``key`` while what it read is unchanged; else ``compute()``, stamped by ``read()`` first."""
        found = self.recall(key)
        if found is not None:
            return found[0]
        before = read()
        value = compute()
        self.remember(key, value, before)
        return value

    def recall(self, key: Hashable) -> tuple[V] | None:
        """``(value,)`` when one is kept for ``key`` and what it read is unchanged; else None (and it is dropped)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if not entry[0].current():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return (entry[1],)

    def remember(self, key: Hashable, value: V, read: Stamp) -> V:
        """Keep ``value`` under ``key`` with the stamp of what it read (an untrusted stamp keeps nothing)."""
        if read.trusted:
            self._entries[key] = (read, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.keep:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()
