"""tests/suite_cache.py: the guard that fails a run which wrote into the user's cache sees what it must."""

from __future__ import annotations

import os
from pathlib import Path

from suite_cache import SHARED_PARTS, _snapshot


def test_the_snapshot_sees_every_file_but_the_shared_parts(tmp_path: Path) -> None:
    (tmp_path / "releases" / "0.5.23" / "sglang").mkdir(parents=True)
    (tmp_path / "releases" / "0.5.23" / "sglang" / "a.py").write_text("a")
    (tmp_path / "releases" / "wheels").mkdir()  # a shared part's name below the top is no shared part
    (tmp_path / "releases" / "wheels" / "w").write_text("w")
    (tmp_path / "verdicts").mkdir()
    (tmp_path / "verdicts" / "v.json").write_text("{}")
    (tmp_path / "top.txt").write_text("t")
    for shared in SHARED_PARTS:
        (tmp_path / shared / "deep").mkdir(parents=True)
        (tmp_path / shared / "deep" / "file").write_text("s")
    (tmp_path / "file-link").symlink_to(tmp_path / "top.txt")
    (tmp_path / "dir-link").symlink_to(tmp_path / "releases")  # never followed: its files are counted once
    before = _snapshot(tmp_path)
    assert set(before) == {
        "releases/0.5.23/sglang/a.py",
        "releases/wheels/w",
        "verdicts/v.json",
        "top.txt",
        "file-link",
    }
    # A change under a shared part is not the suite's to answer for; anything else is.
    for shared in SHARED_PARTS:
        (tmp_path / shared / "deep" / "new").write_text("n")
    assert _snapshot(tmp_path) == before
    (tmp_path / "verdicts" / "w.json").write_text("{}")
    os.utime(tmp_path / "top.txt", ns=(1, 1))
    after = _snapshot(tmp_path)
    assert sorted(p for p in after if before.get(p) != after[p]) == ["file-link", "top.txt", "verdicts/w.json"]
    assert _snapshot(tmp_path / "absent") == {}


def test_the_scratch_is_in_memory_only_where_there_is_room(tmp_path: Path, monkeypatch) -> None:
    import suite_cache

    monkeypatch.delenv(suite_cache.SCRATCH_ENV, raising=False)
    monkeypatch.setattr(suite_cache, "SCRATCH", tmp_path)
    monkeypatch.setattr(suite_cache, "SCRATCH_NEEDS", 1)
    assert suite_cache.scratch() == tmp_path
    monkeypatch.setenv(suite_cache.SCRATCH_ENV, "disk")
    assert suite_cache.scratch() is None
    monkeypatch.delenv(suite_cache.SCRATCH_ENV)
    monkeypatch.setattr(suite_cache, "SCRATCH_NEEDS", 1 << 62)  # more than any machine has free
    assert suite_cache.scratch() is None
    monkeypatch.setattr(suite_cache, "SCRATCH_NEEDS", 1)
    monkeypatch.setattr(suite_cache, "SCRATCH", tmp_path / "absent")
    assert suite_cache.scratch() is None


def test_this_run_s_temporary_files_are_where_its_cache_is() -> None:
    """In memory or on disk as a whole: the cache, this worker's temporary folder and its children's TMPDIR under
    one run folder, which the controller removes at the end; the wheels always on disk."""
    import tempfile

    import suite_cache

    cache = Path(os.environ["PATCHCRAFT_CACHE"])
    run = cache.parent
    assert run.name.startswith("patchcraft-suite-")
    in_memory = (cache / "wheels").is_symlink()
    assert in_memory == os.environ.get("TMPDIR", "").startswith(str(run) + os.sep)
    if in_memory:
        assert run.parent == suite_cache.SCRATCH
        assert Path(tempfile.gettempdir()) == run / "tmp"
        assert not (cache / "wheels").resolve().is_relative_to(run.resolve())
        disk = Path(os.environ[suite_cache.DISK_ENV])  # the crash campaign's lanes (conftest.disk_tmp_path)
        assert disk.is_dir() and os.stat(disk).st_dev != os.stat(run).st_dev
    else:
        assert suite_cache.DISK_ENV not in os.environ


def test_a_run_folder_whose_controller_is_gone_is_removed_and_a_live_one_kept(tmp_path: Path) -> None:
    import subprocess
    import sys

    import suite_cache

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan, live, unowned = (tmp_path / f"patchcraft-suite-{name}" for name in ("orphan", "live", "unowned"))
    for folder in (orphan, live, unowned):
        (folder / "cache").mkdir(parents=True)
    (orphan / suite_cache.OWNER).write_text(gone.stdout.strip())
    (live / suite_cache.OWNER).write_text(str(os.getpid()))
    suite_cache._remove_orphans(tmp_path)
    assert not orphan.exists() and (live / "cache").is_dir() and (unowned / "cache").is_dir()
