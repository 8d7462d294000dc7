"""base.memo: a value computed from files is kept while they are unchanged, and computed again on any change."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from patchcraft.base import memo
from patchcraft.base.memo import Memo, stamp


@pytest.fixture(autouse=True)
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by a test are stamped at once: no racy window (its own test sets one)."""
    monkeypatch.setattr(memo, "RACY_NS", -(10**18))
    monkeypatch.setattr(memo, "COARSE_RACY_NS", -(10**18))


def counting(folder: Path) -> tuple[Memo[int], list[int], object]:
    kept: Memo[int] = Memo(keep=4)
    calls: list[int] = []

    def get() -> int:
        def compute() -> int:
            calls.append(1)
            return sum(p.stat().st_size for p in folder.rglob("*.py"))

        return kept.get("key", lambda: stamp(folders=[(folder, True)]), compute)

    return kept, calls, get


def test_kept_while_unchanged(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    _, calls, get = counting(tmp_path)
    assert get() == get() == 6
    assert len(calls) == 1


def test_a_byte_changed_with_size_and_mtime_kept_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    _, calls, get = counting(tmp_path)
    get()
    info = path.stat()
    time.sleep(0.01)  # the ctime moves on (coarse clocks tick in milliseconds)
    path.write_text("x = 2\n")
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size and path.stat().st_mtime_ns == info.st_mtime_ns
    get()
    assert len(calls) == 2


@pytest.mark.parametrize("where", ["a.py", "sub/b.py"])
def test_a_file_added_or_removed_is_read_again(tmp_path: Path, where: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    _, calls, get = counting(tmp_path)
    get()
    added = tmp_path / "sub" / "c.py"
    added.write_text("y = 2\n")
    assert get() == 12
    added.unlink()
    assert get() == 6
    assert len(calls) == 3


def test_a_folder_not_recursive_ignores_what_is_below_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    before = stamp(folders=[(tmp_path, False)])
    (tmp_path / "sub" / "b.py").write_text("")
    assert before.current()
    (tmp_path / "b.py").write_text("")
    assert not before.current()


def test_a_file_changed_just_before_it_was_stamped_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo, "RACY_NS", 60 * 10**9)
    monkeypatch.setattr(memo, "COARSE_RACY_NS", 60 * 10**9)
    (tmp_path / "a.py").write_text("x = 1\n")
    _, calls, get = counting(tmp_path)
    get()
    get()
    assert len(calls) == 2


def test_a_missing_file_is_stamped_and_its_arrival_noticed(tmp_path: Path) -> None:
    path = tmp_path / "version.py"
    before = stamp([path])
    assert before.current()
    path.write_text("__version__ = '1'\n")
    assert not before.current()


def test_only_the_newest_are_kept(tmp_path: Path) -> None:
    kept: Memo[str] = Memo(keep=2)
    for key in "abc":
        kept.remember(key, key, stamp())
    assert kept.recall("a") is None
    assert kept.recall("b") == ("b",) and kept.recall("c") == ("c",)
