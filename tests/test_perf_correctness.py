"""The speed-ups change nothing: the result cache is never stale, ``--jobs`` never reorders.

Real release 0.5.2 (ten model classes over eight files, plus the runner):
small enough to run a whole tree in well under a second of CPU, big enough
to have models sharing files (qwen2.py serves qwen3 and qwen2_5_vl).
No test here measures time: bench/run.py does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_release, run_cli as cli
from patchcraft import cache, engine
from patchcraft.commands import _pipeline
from patchcraft.engine import Mode
from patchcraft.tree import resolve_target
from patchcraft.workers import FILES_PER_WORKER, map_files

RELEASE = "0.5.2"
INIT = b"self.layers_to_capture = []"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_release(RELEASE, tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def package(pristine: Path, tmp_path: Path) -> Path:
    """A private, writable copy of the release's package."""
    import shutil

    dest = tmp_path / "tree" / "sglang"
    shutil.copytree(pristine, dest)
    return dest


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    """A private result cache; the list records every real engine run."""
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHCRAFT_NO_CACHE", raising=False)
    calls: list = []
    real = _pipeline.run

    def counting(tree, mode, names=(), runner=True, jobs=1, **options):
        calls.append((tree, mode))
        return real(tree, mode, names, runner=runner, jobs=jobs, **options)

    monkeypatch.setattr(_pipeline, "run", counting)
    return calls




def flip_one_byte(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` by ``new`` (same length) and keep the file's size and times."""
    assert len(old) == len(new)
    data = path.read_bytes()
    info = path.stat()
    assert old in data, f"{old!r} not in {path}"
    path.write_bytes(data.replace(old, new, 1))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


# -- the result cache ------------------------------------------------------------------

def test_second_verify_is_served_from_the_cache(package: Path, runs: list, capsys) -> None:
    first = cli(capsys, "verify", "--format", "json", str(package))
    second = cli(capsys, "verify", "--format", "json", str(package))
    assert first == second
    assert len(runs) == 1
    assert first[0] == 1  # an unpatched tree is not verified


def test_a_single_byte_changes_the_result(package: Path, runs: list, capsys, monkeypatch) -> None:
    """One byte in llama.py (size and mtime kept) must not be served the old result."""
    before = cli(capsys, "verify", "--format", "json", str(package))
    flip_one_byte(package / "srt" / "models" / "llama.py", INIT, INIT.replace(b"capture ", b"capturf "))
    after = cli(capsys, "verify", "--format", "json", str(package))
    assert len(runs) == 2
    assert after != before
    assert "never initialises `self.layers_to_capture`" in after[1]
    # And it is exactly what a run without any cache says.
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    assert cli(capsys, "verify", "--format", "json", str(package)) == after


def test_a_byte_in_a_file_no_model_uses_or_a_new_file_invalidates(package: Path, runs: list, capsys) -> None:
    """The key covers every file the engine may read, and the listing, not just what matters today."""
    cli(capsys, "verify", str(package))
    other = next(p for p in sorted((package / "srt" / "models").glob("*.py")) if b"layers_to_capture" not in p.read_bytes())
    flip_one_byte(other, b"import", b"imporT")
    cli(capsys, "verify", str(package))
    (package / "srt" / "models" / "zz_new_model.py").write_text("x = 1\n")
    cli(capsys, "verify", str(package))
    assert len(runs) == 3


def test_apply_then_verify_is_not_stale(package: Path, runs: list, capsys) -> None:
    """verify (cached, not verified) -> apply -> verify must see the patch; writing commands always run."""
    before = cli(capsys, "verify", str(package))
    assert cli(capsys, "apply", str(package))[0] == 0
    after = cli(capsys, "verify", str(package))
    assert after != before
    assert "would-patch" in before[2] and "would-patch" not in after[2]
    assert cli(capsys, "verify", str(package)) == after
    assert cli(capsys, "revert", str(package))[0] == 0
    assert cli(capsys, "apply", str(package))[0] == 0  # the same bytes as the first apply read
    assert [mode for _, mode in runs] == [Mode.VERIFY, Mode.APPLY, Mode.VERIFY, Mode.REVERT, Mode.APPLY]


def test_each_option_that_shapes_the_result_has_its_own_entry(package: Path, runs: list, capsys) -> None:
    variants = [
        ("verify", str(package)),
        ("verify", "--model", "llama", str(package)),
        ("verify", "--no-runner", str(package)),
        ("diff", str(package)),
        ("apply", "--check", str(package)),
        ("verify", str(package / "srt" / "models" / "qwen2.py")),
    ]
    outputs = [cli(capsys, *argv) for argv in variants]
    assert len(runs) == len(variants)
    assert [cli(capsys, *argv) for argv in variants] == outputs  # all served from the cache now
    assert len(runs) == len(variants)


def test_an_edit_to_patchcraft_itself_invalidates(package: Path, runs: list, capsys, monkeypatch) -> None:
    cli(capsys, "verify", str(package))
    monkeypatch.setattr(cache, "_CODE_HASH", "a transform was edited")
    cli(capsys, "verify", str(package))
    assert len(runs) == 2


def test_code_hash_covers_the_transforms() -> None:
    files = {p.name for p in cache._code_files()}
    assert {"engine.py", "plan.py", "graph.py", "_base.py", "capture_embedding_output.py"} <= files


def test_a_damaged_entry_is_a_miss_and_is_removed(package: Path, runs: list, capsys) -> None:
    first = cli(capsys, "verify", str(package))
    (entry,) = cache.directory().glob("*.pickle")
    entry.write_bytes(b"not a cache entry")
    assert cli(capsys, "verify", str(package)) == first
    assert len(runs) == 2
    assert entry.read_bytes() != b"not a cache entry"  # replaced by a good one


def test_an_unusable_cache_directory_just_means_no_cache(package: Path, runs: list, capsys, tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(blocker))  # <file>/runs cannot be created
    first = cli(capsys, "verify", str(package))
    assert cli(capsys, "verify", str(package)) == first
    assert len(runs) == 2


def test_no_cache_variable_turns_it_off(package: Path, runs: list, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    cli(capsys, "verify", str(package))
    cli(capsys, "verify", str(package))
    assert len(runs) == 2
    assert not cache.directory().exists()


def test_the_cache_lives_in_the_user_cache_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PATCHCRAFT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.directory() == tmp_path / "xdg" / "patchcraft" / "runs"
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "mine"))
    assert cache.directory() == tmp_path / "mine" / "runs"


def test_the_key_covers_every_file_the_engine_reads(package: Path, monkeypatch) -> None:
    """Record every file a real run opens; each one inside the tree must be a cache input."""
    read: set = set()
    real_read_bytes, real_open = Path.read_bytes, Path.open
    import builtins
    import io

    real_builtin_open = builtins.open

    def note(path) -> None:
        try:
            read.add(Path(os.path.realpath(os.fspath(path))))
        except TypeError:
            pass  # a file descriptor

    def read_bytes(self):
        note(self)
        return real_read_bytes(self)

    def path_open(self, *args, **kwargs):
        note(self)
        return real_open(self, *args, **kwargs)

    def builtin_open(file, *args, **kwargs):
        note(file)
        return real_builtin_open(file, *args, **kwargs)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "open", path_open)
    monkeypatch.setattr(builtins, "open", builtin_open)
    monkeypatch.setattr(io, "open", builtin_open)
    tree = resolve_target(str(package))
    for mode in (Mode.VERIFY, Mode.DIFF, Mode.CHECK):
        engine.run(tree, mode)
    monkeypatch.undo()
    inside = {p for p in read if str(p).startswith(str(package.resolve()))}
    assert inside, "the recorder saw no read at all"
    inputs = {Path(os.path.realpath(p)) for p in cache.inputs(tree)}
    assert inside <= inputs, f"read but not in the cache key: {sorted(inside - inputs)}"


def test_a_warm_verify_does_not_import_libcst(package: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PATCHCRAFT_CACHE": str(tmp_path / "cache"), "NO_COLOR": "1"}
    env.pop("PATCHCRAFT_NO_CACHE", None)
    command = [sys.executable, "-m", "patchcraft", "verify", str(package)]
    cold = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    warm = subprocess.run([sys.executable, "-X", "importtime", *command[1:]], capture_output=True, text=True, env=env, timeout=300)
    imported = {line.split("|")[-1].strip() for line in warm.stderr.splitlines() if line.startswith("import time:")}
    assert "patchcraft.cache" in imported  # the trace works
    assert not {name for name in imported if name.split(".")[0] == "libcst"}
    assert "patchcraft.transforms" not in imported
    shown = "\n".join(line for line in warm.stderr.splitlines() if not line.startswith("import time:"))
    assert (warm.returncode, warm.stdout, shown + "\n") == (cold.returncode, cold.stdout, cold.stderr)


def test_plain_output_never_imports_rich_and_colour_does(package: Path, tmp_path: Path) -> None:
    """A hook's or CI log's table is written as plain text; rich only styles a terminal."""
    env = {**os.environ, "PATCHCRAFT_NO_CACHE": "1"}
    env.pop("NO_COLOR", None)

    def imported(*options: str) -> set:
        run = subprocess.run([sys.executable, "-X", "importtime", "-m", "patchcraft", "verify", *options, str(package)], capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 1, run.stderr[-2000:]  # an unpatched release
        return {line.split("|")[-1].strip().split(".")[0] for line in run.stderr.splitlines() if line.startswith("import time:")}

    assert "rich" not in imported("--color", "never")
    assert "rich" in imported("--color", "always")


def test_a_single_file_run_loads_only_what_it_uses(package: Path) -> None:
    """One staged model file: no runner transform (no runner row), no worker pool, no rich."""
    env = {**os.environ, "PATCHCRAFT_NO_CACHE": "1", "NO_COLOR": "1"}
    target = package / "srt" / "models" / "llama.py"
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "patchcraft", "verify", str(target)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1, run.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "patchcraft.transforms.capture_embedding_output" in imported  # the trace works
    assert not {"patchcraft.transforms.configure_ids_before_graphs", "multiprocessing", "rich"} & imported


def test_the_collector_is_off_only_for_the_process_entry_point() -> None:
    """``patchcraft`` as a process runs without the cyclic GC; an in-process caller keeps it."""
    code = (
        "import gc, sys\n"
        "from patchcraft.cli import main\n"
        "sys.argv = ['patchcraft', '--version']\n"
        "try:\n    main({argv})\nexcept SystemExit:\n    pass\n"
        "print(gc.isenabled())\n"
    )
    for argv, enabled in (("", "False"), ("['--version']", "True")):
        run = subprocess.run([sys.executable, "-c", code.format(argv=argv)], capture_output=True, text=True, timeout=60)
        assert run.stdout.split()[-1] == enabled, (argv, run.stdout, run.stderr)


def test_plain_table_columns_line_up_and_long_cells_never_wrap(package: Path, capsys) -> None:
    code, _, err = cli(capsys, "verify", "--color", "never", str(package))
    lines = err.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model "))
    table = lines[header:]
    assert len(table) == 1 + len(engine.run(resolve_target(str(package)), Mode.VERIFY).models)
    for column in ("status", "init", "setter", "forward", "compiles", "idempotent", "message"):
        at = table[0].index(column)
        assert all(row[at - 2 : at] == "  " and row[at] != " " for row in table[1:]), (column, table)
    assert all(line == line.rstrip() for line in table)
    # One line per model however long its message: an unsupported model's reason stays whole.
    assert any(len(row) > 120 for row in table[1:]), "0.5.2 has long unsupported reasons"


# -- --jobs ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [Mode.VERIFY, Mode.DIFF, Mode.APPLY, Mode.REVERT])
def test_jobs_give_the_same_result_as_one_job(package: Path, mode: Mode) -> None:
    tree = resolve_target(str(package))
    one = engine.run(tree, mode, jobs=1)
    many = engine.run(tree, mode, jobs=3)
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
    assert one[0] == 2
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

    from patchcraft import lock

    models = tmp_path / "models"
    models.mkdir()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the run: holds the tree lock, two workers busy
        try:
            os.close(read_end)
            with lock.hold([models], on_wait=lambda message: None):
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
    with lock.hold([models], on_wait=waited.append, timeout=0):
        pass
    assert waited == []
