"""patchcraft.base.fetch: concurrent fetches of one release, and wheels checked against their RECORD.

The concurrency cases run real ``patchcraft fetch`` processes into an empty
cache, with pip pointed at a local directory holding the release's wheel
(``PIP_NO_INDEX``, ``PIP_FIND_LINKS``): the real download, rename and unpack
race, offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.fetch import cache_dir, find_wheel, unpack

VERSION = "0.5.10"


def _wheel() -> Path:
    release_package(VERSION)
    wheel = find_wheel(cache_dir() / "wheels", VERSION)
    assert wheel is not None
    return wheel


def _sources(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n) for n in archive.namelist() if n.startswith("sglang/") and n.endswith(".py")}


def _concurrent_fetches(count: int, cache: Path, links: Path) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "PATCHCRAFT_CACHE": str(cache), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}
    command = [sys.executable, "-m", "patchcraft", "fetch", VERSION]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(count)]
    return [
        subprocess.CompletedProcess(p.args, p.wait(timeout=300), p.stdout.read(), p.stderr.read())  # type: ignore[union-attr]
        for p in procs
    ]


@pytest.mark.parametrize("count", [2, 4])
def test_concurrent_fetches_all_succeed_and_leave_one_intact_copy(count: int, tmp_path: Path) -> None:
    wheel = _wheel()
    links = tmp_path / "links"
    links.mkdir()
    shutil.copy2(wheel, links / wheel.name)  # a local index (the run's wheels may be on another file system)
    cache = tmp_path / "cache"
    results = _concurrent_fetches(count, cache, links)
    assert [r.returncode for r in results] == [0] * count, [r.stderr.decode() for r in results]
    package = cache / "releases" / VERSION / "sglang"
    assert {r.stdout.decode().strip() for r in results} == {str(package)}
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == [wheel.name]  # no staging left
    assert sorted(p.name for p in package.parent.iterdir()) == ["sglang"]
    expected = _sources(wheel)
    on_disk = {str(p.relative_to(package.parent)) for p in package.rglob("*.py")}
    assert on_disk == set(expected)
    assert all((package.parent / name).read_bytes() == data for name, data in expected.items())


def _rewritten(wheel: Path, dest: Path, change: dict[str, bytes]) -> Path:
    """A copy of ``wheel`` with the members in ``change`` replaced (their RECORD rows kept): a damaged wheel."""
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            target.writestr(info, change.get(info.filename, source.read(info.filename)))
    return out


def test_a_member_that_differs_from_the_record_is_refused(tmp_path: Path) -> None:
    member = "sglang/srt/models/llama.py"
    damaged = _rewritten(_wheel(), tmp_path, {member: b"# not the release's llama.py\n"})
    with pytest.raises(PatchcraftError) as refused:
        unpack(damaged, tmp_path / "release")
    message = str(refused.value)
    assert "llama.py" in message and "RECORD" in message and "fetch again" in message, message
    assert sorted(p.name for p in (tmp_path / "release").iterdir()) == []  # nothing half unpacked


def test_a_truncated_wheel_is_one_line_naming_it(tmp_path: Path) -> None:
    wheel = _wheel()
    truncated = tmp_path / wheel.name
    truncated.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])
    with pytest.raises(PatchcraftError) as refused:
        unpack(truncated, tmp_path / "release")
    assert str(truncated) in str(refused.value) and "remove it and fetch again" in str(refused.value)


def _lose_the_race(monkeypatch: pytest.MonkeyPatch, wheel: Path, dest: Path, damage: bool) -> None:
    """Another process's unpack lands in ``dest`` while this one is between its extraction and its rename."""
    import patchcraft.base.fetch as fetch_module

    real = fetch_module._check_against_record
    calls = []

    def winner_first(wheel_, package, names, record):
        if not calls:
            calls.append(package)
            monkeypatch.setattr(fetch_module, "_check_against_record", real)
            winner = unpack(wheel, dest)
            if damage:
                (winner / "srt" / "models" / "llama.py").write_text("# damaged\n")
            monkeypatch.setattr(fetch_module, "_check_against_record", winner_first)
        return real(wheel_, package, names, record)

    monkeypatch.setattr(fetch_module, "_check_against_record", winner_first)


def test_the_loser_of_a_race_checks_and_returns_the_winner_s_copy(tmp_path: Path, monkeypatch) -> None:
    wheel = _wheel()
    _lose_the_race(monkeypatch, wheel, tmp_path / "release", damage=False)
    package = unpack(wheel, tmp_path / "release")
    assert sorted(p.name for p in package.parent.iterdir()) == ["sglang"]  # the loser's staging is gone
    assert (package / "srt" / "models" / "llama.py").read_bytes() == _sources(wheel)["sglang/srt/models/llama.py"]


def test_the_loser_of_a_race_refuses_a_damaged_winner(tmp_path: Path, monkeypatch) -> None:
    wheel = _wheel()
    _lose_the_race(monkeypatch, wheel, tmp_path / "release", damage=True)
    with pytest.raises(PatchcraftError) as refused:
        unpack(wheel, tmp_path / "release")
    assert "llama.py" in str(refused.value) and "differ from" in str(refused.value), refused.value
