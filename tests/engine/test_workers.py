"""workers.py: ``--jobs`` never changes a result, and the fork pool never outlives its run.

The same results, printed bytes, error order and written files with one
job or several, on the release copies of conftest.py (SMALL_RELEASE, 0.5.2); workers
start only when each gets enough files, and die with a killed parent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import flip_one_byte, run_cli as cli
from patchcraft.engine import tree_run
from patchcraft.engine.records import Mode
from patchcraft.base.target import resolve_target
from patchcraft.engine.workers import FILES_PER_WORKER, map_files


@pytest.mark.parametrize("mode", [Mode.VERIFY, Mode.DIFF, Mode.APPLY, Mode.REVERT])
def test_jobs_give_the_same_result_as_one_job(package: Path, mode: Mode) -> None:
    tree = resolve_target(str(package))
    one = tree_run.run(tree, mode, jobs=1)
    many = tree_run.run(tree, mode, jobs=3)
    assert one == many
    assert [c.after for c in one.changes] == [c.after for c in many.changes]
    assert [c.source.raw for c in one.changes] == [c.source.raw for c in many.changes]


def test_jobs_print_the_same_bytes(package: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    for argv in (("verify",), ("diff",)):
        one = cli(capsys, *argv, "--jobs", "1", str(package))
        many = cli(capsys, *argv, "--jobs", "4", str(package))
        assert one == many, argv


def test_jobs_keep_errors_in_file_order(package: Path, capsys, monkeypatch) -> None:
    """Hand-changed blocks in two files: the same messages, in the same order, whatever finishes first."""
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    assert cli(capsys, "apply", str(package))[0] == 0
    models = package / "srt" / "models"
    for name in ("llama.py", "qwen2.py"):
        flip_one_byte(models / name, b"if val >= 0]", b"if val >= 1]")
    one = cli(capsys, "verify", "--format", "json", "--jobs", "1", str(package))
    many = cli(capsys, "verify", "--format", "json", "--jobs", "2", str(package))
    assert one == many
    assert one[0] == 1  # error rows: that model's, exit 1 (exit 2 is a run that could not start)
    assert one[1].count('"status": "error"') >= 2


def test_apply_with_jobs_writes_what_one_job_writes(pristine: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    import shutil

    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    trees = []
    for jobs in ("1", "2"):
        dest = tmp_path / f"jobs{jobs}" / "sglang"
        shutil.copytree(pristine, dest)
        assert cli(capsys, "apply", "--jobs", jobs, str(dest))[0] == 0
        trees.append(dest)
    files = sorted(p.relative_to(trees[0]) for p in trees[0].rglob("*.py"))
    assert files == sorted(p.relative_to(trees[1]) for p in trees[1].rglob("*.py"))
    assert all((trees[0] / f).read_bytes() == (trees[1] / f).read_bytes() for f in files)


def _pid(item: tuple) -> int:
    return os.getpid()


def _name(item: tuple) -> str:
    return item[0].name


def test_workers_start_only_when_each_gets_enough_files() -> None:
    """A two-file pre-commit run stays in process; a whole tree's files go to the workers, in order."""
    few = [(Path(f"f{i}.py"), ()) for i in range(2)]
    many = [(Path(f"f{i}.py"), ()) for i in range(2 * FILES_PER_WORKER)]
    assert set(map_files(_pid, few, 2)) == {os.getpid()}
    assert os.getpid() not in map_files(_pid, many, 2)
    assert set(map_files(_pid, many, 1)) == {os.getpid()}
    assert map_files(_name, many, 2) == [p.name for p, _ in many]


def test_jobs_must_be_positive(capsys) -> None:
    code, _, err = cli(capsys, "verify", "--jobs", "0", ".")
    assert code == 2 and "--jobs" in err


def _report_and_block(item: tuple) -> None:
    """A worker task that announces its pid on a pipe, then hangs (as on a huge file)."""
    import time

    os.write(int(str(item[0])), f"{os.getpid()}\n".encode())
    time.sleep(120)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
def test_workers_die_with_a_killed_parent_and_never_hold_the_lock(tmp_path: Path) -> None:
    """SIGKILL a run while its workers are busy: they go too, and the next run gets the lock at once."""
    import signal
    import time

    from patchcraft.base import tree_lock

    models = tmp_path / "models"
    models.mkdir()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the run: holds the tree tree_lock, two workers busy
        try:
            os.close(read_end)
            with tree_lock.hold([models], on_wait=lambda message: None):
                items = [(Path(str(write_end)), ())] * (2 * FILES_PER_WORKER)
                map_files(_report_and_block, items, 2)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        workers = [int(pipe.readline()), int(pipe.readline())]
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [w for w in workers if _alive(w)]
    for worker in survivors:  # never leave them behind, even when the check fails
        os.kill(worker, signal.SIGKILL)
    assert not survivors, "workers outlived their killed parent"
    waited: list = []
    with tree_lock.hold([models], on_wait=waited.append, timeout=0):
        pass
    assert waited == []
