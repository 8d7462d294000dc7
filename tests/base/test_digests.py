"""patchcraft.base.digests: a file's sha256 remembered by its stat, and never trusted once the file changed."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from patchcraft.base import digests


@pytest.fixture
def memo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A private cache, the memo enabled, and no racy window (files made now may be remembered)."""
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHCRAFT_NO_CACHE", raising=False)
    monkeypatch.setattr(digests, "RACY_NS", -(10**12))
    digests.forget()
    yield digests
    digests.forget()


def real(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plant(memo, path: Path, digest: str) -> None:
    """Give ``path`` a remembered digest for its current stat, as a stored memo would."""
    memo.sha256(path)
    stamp = memo._load()[str(path)][0]
    memo._load()[str(path)] = (stamp, digest)


def test_a_remembered_digest_is_used_while_the_stat_is_unchanged(memo, tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    plant(memo, path, "f" * 64)
    assert memo.sha256(path) == "f" * 64  # the speed path: the file was not read again


def test_same_size_and_mtime_restored_is_read_again(memo, tmp_path: Path) -> None:
    """The ctime in the stamp: os.utime restores mtime but moves ctime, so the rewrite is seen."""
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    before = os.stat(path)
    plant(memo, path, "f" * 64)
    time.sleep(0.05)  # past the filesystem's timestamp tick
    path.write_text("x = 2\n")  # same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert memo.sha256(path) == real(path)


def test_a_file_replaced_by_a_rename_is_read_again(memo, tmp_path: Path) -> None:
    path, other = tmp_path / "a.py", tmp_path / "b.py"
    path.write_text("x = 1\n")
    plant(memo, path, "f" * 64)
    other.write_text("x = 2\n")
    os.replace(other, path)
    assert memo.sha256(path) == real(path)


def test_a_recently_changed_file_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHCRAFT_NO_CACHE", raising=False)
    digests.forget()
    try:
        path = tmp_path / "a.py"
        path.write_text("x = 1\n")
        assert digests.sha256(path) == real(path)
        assert str(path) not in digests._load()  # racily clean: a write in the same tick would keep its stat
    finally:
        digests.forget()


def test_the_memo_is_stored_and_read_back_by_the_next_process(memo, tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    memo.sha256(path)
    memo.save()
    stored = memo.store_path()
    assert stored.is_file() and stored.stat().st_mode & 0o077 == 0
    memo.forget()
    assert memo._load()[str(path)][1] == real(path)


def _stored_memo_with_a_lie(memo, tmp_path: Path) -> Path:
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    plant(memo, path, "f" * 64)
    memo._dirty = True
    memo.save()
    memo.forget()
    return path


def test_a_memo_others_can_write_is_not_trusted(memo, tmp_path: Path) -> None:
    path = _stored_memo_with_a_lie(memo, tmp_path)
    assert memo.sha256(path) == "f" * 64  # control: our own memo is read
    memo.forget()
    os.chmod(memo.store_path(), 0o666)
    assert memo.sha256(path) == real(path)


def test_a_memo_another_user_owns_is_not_trusted(memo, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    path = _stored_memo_with_a_lie(memo, tmp_path)
    os.chown(memo.store_path(), 65534, 65534)
    assert memo.sha256(path) == real(path)


@pytest.mark.parametrize("content", [b"", b"garbage", b"\xe3\x00\x00", None])
def test_a_damaged_memo_is_an_empty_one(memo, tmp_path: Path, content: bytes | None) -> None:
    path = _stored_memo_with_a_lie(memo, tmp_path)
    import marshal

    memo.store_path().write_bytes(
        content if content is not None else marshal.dumps({"format": 1, "files": {str(path): "x"}})
    )
    assert memo.sha256(path) == real(path)


def test_no_cache_turns_it_off(memo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _stored_memo_with_a_lie(memo, tmp_path)
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    assert memo.sha256(path) == real(path)


def test_an_unwritable_cache_is_no_error(memo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_CACHE", "/proc/patchcraft-cache")
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    assert memo.sha256(path) == real(path)
    memo.save()  # nothing raised


def test_a_missing_file_raises_as_open_does(memo, tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    memo.sha256(path)
    path.unlink()
    with pytest.raises(FileNotFoundError):
        memo.sha256(path)
