"""One entry of a verdict cache (patchcraft.engine.cache_entries): used only when ours, intact and of its key."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from patchcraft.engine import cache_entries

ENTRY = {"format": 3, "key": "k1", "value": [1, "two"]}


def written(folder: Path) -> Path:
    cache_entries.write_entry(folder, "k1", ENTRY, keep=8)
    return folder / "k1.json"


def test_an_entry_is_read_back_as_written(tmp_path: Path) -> None:
    path = written(tmp_path / "entries")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    entry = cache_entries.read_entry(path, 3, "k1")
    assert entry is not None and entry["value"] == [1, "two"]


@pytest.mark.parametrize("wrong", ["format", "key"])
def test_another_format_or_key_is_refused_and_removed(tmp_path: Path, wrong: str) -> None:
    path = written(tmp_path / "entries")
    fmt, key = (4, "k1") if wrong == "format" else (3, "k2")
    assert cache_entries.read_entry(path, fmt, key) is None
    assert not path.exists()


def test_a_changed_body_is_refused_and_removed(tmp_path: Path) -> None:
    path = written(tmp_path / "entries")
    data = json.loads(path.read_text())
    data["value"] = [1, "three"]
    path.write_text(json.dumps(data))
    assert cache_entries.read_entry(path, 3, "k1") is None
    assert not path.exists()


def test_an_entry_others_can_write_is_never_used(tmp_path: Path) -> None:
    path = written(tmp_path / "entries")
    os.chmod(path, 0o620)
    assert cache_entries.read_entry(path, 3, "k1") is None


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_another_user_s_entry_is_never_used(tmp_path: Path) -> None:
    path = written(tmp_path / "entries")
    os.chown(path, 65534, 65534)
    assert cache_entries.read_entry(path, 3, "k1") is None


def test_only_the_newest_entries_are_kept(tmp_path: Path) -> None:
    folder = tmp_path / "entries"
    for number in range(5):
        cache_entries.write_entry(folder, f"k{number}", {"format": 1, "key": f"k{number}"}, keep=3)
        os.utime(folder / f"k{number}.json", (number, number))
    assert sorted(p.name for p in folder.glob("*.json")) == ["k2.json", "k3.json", "k4.json"]


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    cache_entries.write_entry(blocked / "entries", "k1", ENTRY, keep=8)  # nothing written, nothing raised
    assert cache_entries.read_entry(blocked / "entries" / "k1.json", 3, "k1") is None
