"""An unusable cache is a user error: one line, exit 2, naming the path and PATCHCRAFT_CACHE, never a traceback.

Every case of issue #23 item 6, each in a real subprocess over a real
release (0.5.10): a read-only mount, a path under /proc, a root-owned cache
seen by a non-root uid, HOME unset, and a uid with no passwd entry (the
OpenShift case). The permission cases run as another uid
(tests/unprivileged.py): root ignores file modes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from conftest import copy_release
from unprivileged import NOBODY, clean_env, open_directory, require_root_tools, run_as

RELEASE = "0.5.10"
PATCHCRAFT = [sys.executable, "-m", "patchcraft"]
#: A uid with no passwd entry, as OpenShift assigns.
NO_PASSWD = 1000123456


@pytest.fixture(scope="module")
def world() -> Iterator[Path]:
    """A directory any uid can read: a copy of the release, and the caches under test."""
    root = open_directory()
    copy_release(RELEASE, root / "release")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run_overlay(world: Path) -> list[str]:
    """``patchcraft run`` with an overlay to build (the cache is needed); no preflight, no harness."""
    return [
        *PATCHCRAFT,
        "run",
        "--target",
        str(world / "release" / "sglang"),
        "--no-smoke",
        "--no-preflight",
        "--",
        "true",
    ]


FETCH = [*PATCHCRAFT, "fetch", "0.4.6.post9"]  # not a cached wheel: the wheels directory is written first


def assert_cache_error(proc: subprocess.CompletedProcess, path: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("patchcraft: error: ") and path in lines[0] and "PATCHCRAFT_CACHE" in lines[0], lines[0]


def on_read_only_mount(mount: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``argv`` with a read-only tmpfs at ``mount``, in a private mount namespace that ends with it."""
    require_root_tools()
    mount.mkdir(exist_ok=True)
    script = f'mount -t tmpfs -o ro patchcraft-test {mount} && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *argv], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.parametrize("argv", ["run", "fetch"])
def test_a_read_only_mount(world: Path, argv: str) -> None:
    cache = world / "ro" / "cache"
    command = run_overlay(world) if argv == "run" else FETCH
    proc = on_read_only_mount(world / "ro", command, clean_env(HOME="/root", PATCHCRAFT_CACHE=str(cache)))
    assert_cache_error(proc, str(cache))
    assert "Read-only file system" in proc.stderr


@pytest.mark.parametrize("argv", ["run", "fetch"])
def test_a_cache_under_proc(world: Path, argv: str) -> None:
    command = run_overlay(world) if argv == "run" else FETCH
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=clean_env(HOME="/root", PATCHCRAFT_CACHE="/proc/patchcraft"),
        timeout=300,
    )
    assert_cache_error(proc, "/proc/patchcraft")


@pytest.mark.parametrize("existing", [False, True], ids=["empty", "with-overlays-dir"])
def test_a_root_owned_cache_for_a_non_root_user(world: Path, existing: bool) -> None:
    """mode 0755, owned by root: the unprivileged uid cannot write it, whether or not the subdirectory exists."""
    cache = world / f"root-cache-{existing}"
    (cache / "overlays" if existing else cache).mkdir(parents=True, exist_ok=True)
    for path in (cache, cache / "overlays"):
        if path.exists():
            path.chmod(0o755)
    proc = run_as(NOBODY, run_overlay(world), clean_env(HOME="/nonexistent", PATCHCRAFT_CACHE=str(cache)))
    assert_cache_error(proc, str(cache / "overlays"))
    assert "Permission denied" in proc.stderr


def test_home_unset_for_a_non_root_user(world: Path) -> None:
    """No HOME: the passwd entry's home (/nonexistent for nobody), which nobody can create."""
    proc = run_as(NOBODY, run_overlay(world), clean_env())
    assert_cache_error(proc, "/nonexistent/.cache/patchcraft")


@pytest.mark.parametrize("argv", ["run", "fetch", "overlay-build"])
def test_a_uid_with_no_passwd_entry(world: Path, argv: str) -> None:
    """The OpenShift case: no HOME, no passwd entry ("Could not determine home directory" before)."""
    command = {
        "run": run_overlay(world),
        "fetch": FETCH,
        "overlay-build": [*PATCHCRAFT, "overlay", "build", str(world / "release" / "sglang"), "--no-smoke"],
    }[argv]
    proc = run_as(NO_PASSWD, command, clean_env())
    assert_cache_error(proc, "~/.cache/patchcraft")
    assert f"uid {NO_PASSWD}" in proc.stderr and "no passwd entry" in proc.stderr


def test_the_result_cache_stays_optional(world: Path) -> None:
    """verify only reads: with no cache root at all it runs uncached, and reports as usual."""
    proc = run_as(
        NO_PASSWD, [*PATCHCRAFT, "verify", "--color", "never", str(world / "release" / "sglang")], clean_env()
    )
    assert proc.returncode == 1, proc.stderr  # an unpatched release: not verified
    assert "Traceback" not in proc.stderr and "error" not in proc.stderr, proc.stderr
