"""One writer per SGLang tree: an advisory lock file in the models directory.

Two ``patchcraft apply`` runs on the same tree would both read the
unpatched files, and the second would overwrite the first's work from a
stale reading. So every writing command (``apply``, ``revert``) holds an
exclusive ``flock`` on ``srt/models/.patchcraft.lock`` from before it reads
the first file until after it wrote the last. A second run waits (and says
so, naming the holder's pid), then reads the files afresh: it finds them
patched and has nothing left to do.

The kernel drops the lock when its holder dies, even by ``SIGKILL``, so a
killed run never blocks the next one. The file is removed on release; the
inode is re-checked after locking, so a waiter never holds a lock on a
file that was already unlinked. A directory patchcraft cannot create the
lock file in is a directory it cannot write to either: the write is then
refused later, with its own message, and no lock is needed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from patchcraft.base.errors import PatchcraftError

try:  # POSIX only; SGLang runs on Linux.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".patchcraft.lock"
#: Seconds to wait for another run before giving up (``PATCHCRAFT_LOCK_TIMEOUT``).
DEFAULT_TIMEOUT = 120.0
_POLL = 0.05
#: No lock file can be made there: nothing can be written there either (the
#: write is refused later), or there is no such directory (the run says so).
_NO_LOCK_NEEDED = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR)


def timeout_from_env() -> float:
    try:
        return float(os.environ.get("PATCHCRAFT_LOCK_TIMEOUT", DEFAULT_TIMEOUT))
    except ValueError:
        raise PatchcraftError("PATCHCRAFT_LOCK_TIMEOUT must be a number of seconds") from None


class TreeLock:
    """An exclusive lock on one directory, held by this process."""

    def __init__(self, directory: Path, timeout: float, on_wait: Callable[[str], None]) -> None:
        self.path = Path(directory) / LOCK_NAME
        self.timeout = timeout
        self.on_wait = on_wait
        self.fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock, waiting if needed; False if the directory is not writable."""
        if fcntl is None:
            return False
        deadline = time.monotonic() + self.timeout
        announced = False
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                if exc.errno in _NO_LOCK_NEEDED:
                    return False
                raise PatchcraftError(f"{self.path}: cannot create lock file ({exc.strerror})") from None
            if self._try_lock(fd):
                self.fd = fd
                self._write_pid()
                if announced:
                    self.on_wait("patchcraft: the other run finished; continuing with fresh reads")
                return True
            os.close(fd)
            if not announced:
                self.on_wait(self._waiting_message())
                announced = True
            if time.monotonic() > deadline:
                raise PatchcraftError(
                    f"{self.path}: another patchcraft run ({self._holder()}) has held this tree for over "
                    f"{self.timeout:g} s; nothing was changed (remove the lock file only if no patchcraft is running)"
                )
            time.sleep(_POLL)

    def _try_lock(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        # The holder we waited for unlinks the file before unlocking: make sure
        # ours is still the file at that path, or we would lock a dead inode.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return same

    def _write_pid(self) -> None:
        assert self.fd is not None
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
            os.write(self.fd, f"{os.getpid()}\n".encode())

    def _holder(self) -> str:
        try:
            pid = self.path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            pid = ""
        return f"pid {pid}" if pid.isdigit() else "pid unknown"

    def _waiting_message(self) -> str:
        return (
            f"patchcraft: another patchcraft run ({self._holder()}) is writing {self.path.parent}; "
            "waiting for it to finish, then re-reading the files"
        )

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.fd)  # closing the descriptor drops the flock
        self.fd = None


@contextlib.contextmanager
def hold(
    directories: Sequence[Path], on_wait: Callable[[str], None], timeout: float | None = None
) -> Iterator[list[TreeLock]]:
    """Hold the locks of ``directories`` (deduplicated, in a fixed order: no deadlock)."""
    wait = timeout_from_env() if timeout is None else timeout
    unique = sorted({Path(os.path.realpath(d)) for d in directories})
    held: list[TreeLock] = []
    try:
        for directory in unique:
            lock = TreeLock(directory, wait, on_wait)
            if lock.acquire():
                held.append(lock)
        yield held
    finally:
        for lock in reversed(held):
            lock.release()
