"""The suite's own cache: one directory per run, wheels shared with the user's store, nothing else.

- :func:`configure` (pytest_configure): the controller makes a new cache
  directory and exports it as ``PATCHCRAFT_CACHE`` (xdist workers inherit it
  through ``PATCHCRAFT_SUITE_CACHE``); the user's wheels are linked into its
  ``wheels/`` (hard links, copies across file systems). Where the machine
  has the room (:func:`scratch`), the cache and every test's temporary
  directory (``TMPDIR``, for the workers and their children too) live in
  memory, on ``/dev/shm``: the suite unpacks every release and copies
  release trees thousands of times, and on a disk file system a fifth of
  its CPU is system time (docs/performance.md, "Seventh pass"). The wheels
  stay on disk: ``wheels/`` is then a link to a folder in the default
  temporary directory, the store's wheels hard-linked into it. The user's
  store is
  ``PATCHCRAFT_TEST_WHEELS``, else the ``wheels/`` of the cache patchcraft
  would use outside the suite. A wheel is trusted only once unpacked: every
  source file is checked against the wheel's RECORD (patchcraft.base.fetch).
- :func:`prefetch` (a session fixture): the wheels of every release the
  suite reads, downloaded in parallel, each once across workers.
- :func:`finish` (pytest_sessionfinish, controller): new wheels go to the
  user's store (whole files, atomically), the run's directory is removed,
  and the run fails if anything else under the user's cache changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator, Optional

import pytest

from patchcraft.base.cache_root import root
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.fetch import download_wheel, find_wheel

SESSION_ENV = "PATCHCRAFT_SUITE_CACHE"
STORE_ENV = "PATCHCRAFT_TEST_WHEELS"
#: The user's cache parts the suite may add to: downloaded wheels, and pre-commit's hook environment (tests/test_precommit.py).
SHARED_PARTS = ("wheels", "pre-commit", "engines")
#: The forks on PyPI whose wheels the suite downloads (tests/fork_wheels.py), as wheel files spell their names.
FORK_WHEELS = ("sglang_kt", "lsglang")
#: Fewer selected tests than this (a contributor's inner loop): releases are fetched when first used, not up front.
PREFETCH_FROM = 50
#: The memory file system the suite's scratch goes to, and what must be free there and in memory for it to.
SCRATCH = Path("/dev/shm")
SCRATCH_NEEDS = 8 << 30
#: ``disk``: keep the scratch on the default temporary directory whatever the machine has.
SCRATCH_ENV = "PATCHCRAFT_SUITE_SCRATCH"
#: With the scratch in memory: a folder on disk for the tests that must see a disk file system's timing.
DISK_ENV = "PATCHCRAFT_SUITE_DISK_TMP"

_state: dict[str, object] = {}


def _user_store() -> Optional[Path]:
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV])
    try:
        return root() / "wheels"
    except PatchcraftError:  # no home directory: nothing to share
        return None


def _snapshot(cache: Path) -> dict[str, int]:
    """``{relative path: mtime_ns}`` of every file under ``cache`` but the shared parts.

    The shared parts are never entered: the engines' environments alone hold
    over a hundred thousand files. A link is recorded as the file it points
    to and never followed into a directory; a file that goes while the walk
    runs is left out.
    """
    found: dict[str, int] = {}
    pending = [(str(cache), "")]
    while pending:
        directory, prefix = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if not prefix and entry.name in SHARED_PARTS:
                continue
            relative = prefix + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, relative + os.sep))
                elif entry.is_file():
                    found[relative] = entry.stat().st_mtime_ns
            except OSError:
                continue
    return found


def scratch() -> Path | None:
    """:data:`SCRATCH` when it is a writable folder with :data:`SCRATCH_NEEDS` free, and as much memory is
    available; None otherwise, or with ``PATCHCRAFT_SUITE_SCRATCH=disk``."""
    if os.environ.get(SCRATCH_ENV) == "disk" or not os.access(SCRATCH, os.W_OK | os.X_OK):
        return None
    try:
        info = os.statvfs(SCRATCH)
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            available = next(int(line.split()[1]) << 10 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return SCRATCH if min(info.f_bavail * info.f_frsize, available) >= SCRATCH_NEEDS else None


#: The run folder's file naming the controller's process: a folder whose process is gone is an orphan.
OWNER = "controller.pid"


def _remove_orphans(folder: Path) -> None:
    """Remove the run folders in ``folder`` that a killed run left (their controller is gone): in memory, they
    would hold their 2-3 GB until the machine restarts. A folder of a run still going is left alone."""
    for run in folder.glob("patchcraft-suite-*"):
        try:
            pid = int((run / OWNER).read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(run, ignore_errors=True)
        except (OSError, ValueError):  # no owner file (being made, or not ours), or another user's process
            continue


def configure(config: pytest.Config) -> None:
    if os.environ.get(SESSION_ENV):  # an xdist worker: the controller made it
        os.environ["PATCHCRAFT_CACHE"] = os.environ[SESSION_ENV]
        return
    store = _user_store()
    user_cache = store.parent if store is not None and not os.environ.get(STORE_ENV) else None
    memory = scratch()
    if memory is not None:
        _remove_orphans(memory)
    run = Path(tempfile.mkdtemp(prefix="patchcraft-suite-", dir=memory))
    (run / OWNER).write_text(str(os.getpid()))
    cache = run / "cache"
    cache.mkdir(mode=0o700)
    wheels = cache / "wheels"
    if memory is None:
        wheels.mkdir()
    else:  # the wheels on disk, in the default temporary directory; the tests' scratch in memory
        os.chmod(run, 0o755)
        on_disk = Path(tempfile.mkdtemp(prefix="patchcraft-suite-disk-"))
        (on_disk / "wheels").mkdir()
        wheels.symlink_to(on_disk / "wheels", target_is_directory=True)
        (on_disk / "tmp").mkdir()
        os.environ[DISK_ENV] = str(on_disk / "tmp")  # conftest's disk_tmp_path
        temporary = run / "tmp"
        temporary.mkdir()
        os.chmod(temporary, 0o1777)  # as /tmp: a test's unprivileged user makes its own folders in it
        os.environ["TMPDIR"] = str(temporary)
        tempfile.tempdir = None  # gettempdir() asks again: pytest's tmp_path, this process's and every child's
        _state["wheels"] = on_disk
    linked = _link_wheels(store, wheels) if store is not None else set()
    _state.update(run=run, cache=cache, store=store, linked=linked, user_cache=user_cache)
    _state["before"] = _snapshot(user_cache) if user_cache is not None else {}
    os.environ[SESSION_ENV] = os.environ["PATCHCRAFT_CACHE"] = str(cache)


def _link_wheels(store: Path, wheels: Path) -> set[str]:
    names: set[str] = set()
    for wheel in _shared_archives(store) if store.is_dir() else ():
        try:
            os.link(wheel, wheels / wheel.name)
        except OSError:
            shutil.copy2(wheel, wheels / wheel.name)
        names.add(wheel.name)
    return names


def _shared_archives(folder: Path) -> list[Path]:
    """The shared downloads in ``folder``: SGLang wheels, vLLM's slim archives (patchcraft.base.vllm_fetch)
    and the wheels of the forks published under their own names (tests/fork_wheels.py)."""
    forks = [wheel for name in FORK_WHEELS for wheel in sorted(folder.glob(f"{name}-*.whl"))]
    return sorted(folder.glob("sglang-*.whl")) + sorted(folder.glob("vllm-*.slim*.zip")) + forks


def finish(session: pytest.Session) -> None:
    cache = _state.get("cache")
    if not isinstance(cache, Path):  # an xdist worker, or configure never ran
        return
    store = _state.get("store")
    if isinstance(store, Path):
        _store_new_wheels(cache / "wheels", store, _state.get("linked") or set())  # type: ignore[arg-type]
    for folder in (_state.get("run"), _state.get("wheels")):
        if isinstance(folder, Path):
            shutil.rmtree(folder, ignore_errors=True)
    user_cache = _state.get("user_cache")
    if isinstance(user_cache, Path):
        before = _state.get("before") or {}
        after = _snapshot(user_cache)
        changed = sorted(p for p in after if before.get(p) != after[p])  # type: ignore[union-attr]
        if changed:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            session.config.get_terminal_writer().line(
                f"suite_cache: the suite wrote into the user's cache {user_cache}: {shown}", red=True
            )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _store_new_wheels(wheels: Path, store: Path, linked: set[str]) -> None:
    """Each whole wheel this run downloaded, moved into the user's store atomically (a failure keeps the run's)."""
    try:
        store.mkdir(parents=True, exist_ok=True)
        for wheel in _shared_archives(wheels):
            if wheel.name in linked or (store / wheel.name).exists():
                continue
            handle, temporary = tempfile.mkstemp(prefix=".suite-", suffix=".part", dir=store)
            os.close(handle)
            shutil.copy2(wheel, temporary)
            os.replace(temporary, store / wheel.name)
    except OSError:
        pass  # a read-only store: the next run downloads again


@contextlib.contextmanager
def release_lock(version: str) -> Iterator[None]:
    """Held while one process of this run fetches ``version``; another (an xdist worker) waits, then finds it."""
    locks = Path(os.environ.get(SESSION_ENV) or tempfile.gettempdir()) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{version}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prefetch(versions: Iterable[str], selected: int) -> None:
    """Download the wheels of ``versions`` not in the run's cache yet, eight at a time (pip is the slow part).

    Nothing is fetched up front for a small selection (``selected`` tests,
    below :data:`PREFETCH_FROM`): the inner loop fetches what it uses.
    A wheel that cannot be had is left to the test that needs it, which says why.
    """
    if selected < PREFETCH_FROM:
        return
    wheels = Path(os.environ["PATCHCRAFT_CACHE"]) / "wheels"
    missing = [v for v in versions if find_wheel(wheels, v) is None]

    def one(version: str) -> None:
        with release_lock(version), contextlib.suppress(PatchcraftError):
            download_wheel(version, wheels)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, missing))


def store_name() -> str:
    store = _state.get("store")
    return str(store) if store is not None else "nothing (no home directory)"


def torch_build() -> str:
    """One line: which torch the harness tests run on (docs/contributing.md, "torch")."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "torch: not installed: the harness tests are skipped (pip install -e '.[test]' installs it)"
    version = importlib.metadata.version("torch")
    if "+cpu" in version:
        return f"torch {version}: the CPU build"
    return (
        f"torch {version}: not the CPU build; the harness runs on the CPU all the same "
        "(the CUDA build is only bigger: docs/contributing.md says how to install the CPU one)"
    )
