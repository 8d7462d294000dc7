"""cache_root's housekeeping shared by the run-result and preflight caches: keep the newest entries, remove quietly."""

from __future__ import annotations

import os
from pathlib import Path

from patchcraft.base.cache_root import keep_newest, remove_quietly


def _entries(folder: Path, names: list[str], suffix: str) -> None:
    for age, name in enumerate(reversed(names)):
        path = folder / f"{name}{suffix}"
        path.write_text(name)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))  # names[0] is the newest


def test_keep_newest_removes_the_oldest_entries_of_its_pattern_only(tmp_path: Path) -> None:
    _entries(tmp_path, ["d", "c", "b", "a"], ".json")
    (tmp_path / "other.pickle").write_text("not this cache's")
    keep_newest(tmp_path, "*.json", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "d.json", "other.pickle"]


def test_keep_newest_with_room_to_spare_removes_nothing(tmp_path: Path) -> None:
    _entries(tmp_path, ["b", "a"], ".pickle")
    keep_newest(tmp_path, "*.pickle", 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pickle", "b.pickle"]


def test_remove_quietly_ignores_an_entry_already_gone(tmp_path: Path) -> None:
    entry = tmp_path / "x.json"
    entry.write_text("{}")
    remove_quietly(entry)
    remove_quietly(entry)
    assert not entry.exists()
