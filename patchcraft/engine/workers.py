"""The speed machinery of a run: a fork-based worker pool and a paused garbage collector.

Neither changes a result: :func:`map_files` returns what
``[func(item) for item in items]`` would, in the same order, and
:func:`gc_paused` only defers the collector's work to the end of a run
(docs/performance.md).
"""

from __future__ import annotations

import functools
import gc
import os
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

_Result = TypeVar("_Result")


def gc_paused(func: Callable[..., _Result]) -> Callable[..., _Result]:
    """Run ``func`` with the cyclic garbage collector off.

    A run allocates millions of small objects (ast and libcst nodes) that
    live until it ends; the collector would rescan them over and over, which
    is 30-60% of a cold run (docs/performance.md). Nothing is lost: the
    collector is switched back on afterwards and reclaims any cycles then.
    """

    @functools.wraps(func)
    def paused(*args: Any, **kwargs: Any) -> _Result:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return func(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return paused


#: Files each worker must have for ``--jobs`` to start worker processes at all
#: (0.5.23: 29 files, 1.31 s with one job, 1.12 s with two; two files: no gain).
FILES_PER_WORKER = 4


def map_files(func: Callable[[Any], _Result], items: Sequence[tuple[Path, Any]], jobs: int) -> list[_Result]:
    """``[func(item) for item in items]``, on up to ``jobs`` processes, in the order of ``items``.

    Workers are forked after the transforms are imported, so they start in
    milliseconds; the biggest files go first, so that one big file does not
    come last and leave the other workers idle. Without ``fork`` (not Linux)
    the files are patched here, one after the other. So are runs with fewer
    than :data:`FILES_PER_WORKER` files per worker: only the edited methods
    are parsed, a file takes milliseconds, and starting the pool would cost
    more than it saves (a pre-commit run on llama.py patches two files).
    """
    workers = min(jobs, len(items) // FILES_PER_WORKER)
    if workers <= 1:
        return [func(item) for item in items]
    import multiprocessing  # only now: a small run (pre-commit) does without it

    if "fork" not in multiprocessing.get_all_start_methods():
        return [func(item) for item in items]
    from concurrent.futures import ProcessPoolExecutor

    import patchcraft.transforms  # noqa: F401  (libcst and the transforms: imported once, before forking)

    order = sorted(range(len(items)), key=lambda i: -_size(items[i][0]))
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_worker_start, initargs=(os.getpid(),)
    ) as pool:
        futures = {i: pool.submit(func, items[i]) for i in order}
        return [futures[i].result() for i in range(len(items))]


def _worker_start(parent: int) -> None:
    """Set up a forked worker so that it never outlives, or outlocks, its parent.

    A worker inherits the parent's descriptors, the tree lock's among them,
    and would wait for work forever if the parent were killed (``SIGKILL``,
    the OOM killer): the next ``apply`` would then wait on a lock that no
    live run holds. So the worker drops its copy of the lock and dies with
    its parent. Ctrl-C reaches the whole process group: only the parent
    handles it (one "interrupted" line, exit 130), not every worker.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _close_inherited_locks()
    _die_with_parent(parent)


def _close_inherited_locks() -> None:
    from patchcraft.base.tree_lock import LOCK_NAME

    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:  # no /proc: the lock is then released when the workers exit
        return
    for name in descriptors:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if os.path.basename(target.removesuffix(" (deleted)")) == LOCK_NAME:
            os.close(int(name))  # the parent's own descriptor keeps the lock


def _die_with_parent(parent: int) -> None:
    import signal

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(1, signal.SIGKILL) == 0  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        import threading
        import time

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.2)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
