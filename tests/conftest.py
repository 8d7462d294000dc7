"""Shared fixtures: real SGLang releases fetched once into the cache, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from patchcraft.fetch import cache_dir, fetch

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden"
#: Parts of a release a test tree needs (never the whole package: it is big).
COPIED = ("srt/models", "srt/model_executor", "srt/layers/aux_hidden_states.py", "version.py", "_version.py", "__init__.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="Rewrite golden/ from the current transforms (review the diff!).")


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for the whole session: the applied release copies that tests share."""
    return tmp_path_factory.mktemp("golden")


def release_package(version: str) -> Path:
    """The cached, pristine package root of a release (downloaded on first use).

    Tests unpack into their own directory of the cache, never the one
    ``--release`` and ``fetch`` hand to users, which a user may have patched.
    """
    return fetch(version, cache_dir() / "test-releases" / version)


def copy_release(version: str, dest: Path) -> Path:
    """Copy the parts of release ``version`` that patchcraft reads into ``dest/sglang``."""
    source = release_package(version)
    package = dest / "sglang"
    for part in COPIED:
        src = source / part
        if src.is_dir():
            shutil.copytree(src, package / part, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (package / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, package / part)
    return package


@pytest.fixture
def release_copy(tmp_path: Path):
    """Factory: ``release_copy("0.5.10")`` -> a private, writable package root."""

    def make(version: str) -> Path:
        return copy_release(version, tmp_path / version)

    return make


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """``patchcraft ARGV`` in process: (exit code, stdout, stderr) of that run alone."""
    from patchcraft.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err
