"""The SGLang releases patchcraft is tested on: one definition for the tests and the scripts.

- :data:`MATRIX`: the coverage matrix (golden files, docs/coverage.md's
  per-model tables, the reliability and harness suites).
- :data:`BETWEEN`: releases between matrix ones, checked without golden files.
- :data:`ALL_RELEASES`: every release from 0.4.6 to 0.5.23, posts included
  (62), oldest first: what ``scripts/sweep.py --all`` runs.
- :data:`MINOR_RELEASES`: one per minor version, the plain ``X.Y.Z``
  release (28): what tests/test_release_history.py runs.

:func:`version_key` sorts versions; :func:`newest_release` asks the package
index (``pip index versions sglang``) for the newest release.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Iterable, Sequence

from patchcraft.base.errors import PatchcraftError

#: The coverage matrix: every release here has a golden/<release>/ set (0.4.6 patches nothing).
MATRIX: tuple[str, ...] = ("0.4.6", "0.4.10", "0.5.2", "0.5.6", "0.5.10", "0.5.15", "0.5.20", "0.5.23")
#: Releases in between, checked without golden files.
BETWEEN: tuple[str, ...] = ("0.5.13", "0.5.18")

#: Every release from 0.4.6 to 0.5.23, posts included, oldest first.
ALL_RELEASES: tuple[str, ...] = (
    "0.4.6", "0.4.6.post1", "0.4.6.post2", "0.4.6.post3", "0.4.6.post4", "0.4.6.post5",
    "0.4.7", "0.4.7.post1",
    "0.4.8", "0.4.8.post1",
    "0.4.9", "0.4.9.post1", "0.4.9.post2", "0.4.9.post3", "0.4.9.post4", "0.4.9.post5", "0.4.9.post6",
    "0.4.10", "0.4.10.post1", "0.4.10.post2",
    "0.5.1", "0.5.1.post1", "0.5.1.post2", "0.5.1.post3",
    "0.5.2",
    "0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.3.post3",
    "0.5.4", "0.5.4.post1", "0.5.4.post2", "0.5.4.post3",
    "0.5.5", "0.5.5.post1", "0.5.5.post2", "0.5.5.post3",
    "0.5.6", "0.5.6.post1", "0.5.6.post2",
    "0.5.7",
    "0.5.8", "0.5.8.post1",
    "0.5.9",
    "0.5.10", "0.5.10.post1",
    "0.5.11",
    "0.5.12", "0.5.12.post1",
    "0.5.13", "0.5.13.post1",
    "0.5.14",
    "0.5.15", "0.5.15.post1",
    "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip

_VERSION = re.compile(r"^(\d+(?:\.\d+)*)(?:\.post(\d+))?$")


def version_key(version: str) -> tuple[tuple[int, ...], int]:
    """Sort key for final releases: ``0.5.9 < 0.5.10 < 0.5.10.post1 < 0.5.11``.

    Raises ``ValueError`` for anything else (pre-releases, local versions).
    """
    match = _VERSION.match(version.strip())
    if not match:
        raise ValueError(f"{version!r} is not a final release version (e.g. 0.5.10 or 0.5.10.post1)")
    return tuple(int(part) for part in match.group(1).split(".")), int(match.group(2) or -1)


def is_post(version: str) -> bool:
    return version_key(version)[1] >= 0


def minor_releases(versions: Iterable[str]) -> tuple[str, ...]:
    """The plain ``X.Y.Z`` releases of ``versions`` (no posts), sorted."""
    return tuple(sorted((v for v in versions if not is_post(v)), key=version_key))


#: One release per minor version: the plain X.Y.Z release (0.4.6, 0.4.7, ..., 0.5.23).
MINOR_RELEASES: tuple[str, ...] = minor_releases(ALL_RELEASES)


def parse_index_versions(text: str) -> list[str]:
    """The final releases in ``pip index versions`` output, newest first (others are ignored)."""
    for line in text.splitlines():
        if line.strip().startswith("Available versions:"):
            found = [v.strip() for v in line.split(":", 1)[1].split(",")]
            finals = [v for v in found if _VERSION.match(v)]
            return sorted(finals, key=version_key, reverse=True)
    return []


def newest_release(
    package: str = "sglang", pip: Sequence[str] = (sys.executable, "-m", "pip"), timeout: float = 120
) -> str:
    """The newest final release of ``package`` on the configured package index.

    Runs ``pip index versions PACKAGE``; any failure (no network, no such
    package, output pip no longer prints that way) is a :class:`PatchcraftError`
    that says which.
    """
    command = [*pip, "index", "versions", package, "--disable-pip-version-check"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PatchcraftError(f"cannot run pip to list the releases of {package}: {exc}") from None
    if proc.returncode != 0:
        last = ([line for line in proc.stderr.splitlines() if line.strip()] or ["no output"])[-1]
        raise PatchcraftError(f"pip index versions {package} failed (exit {proc.returncode}): {last.strip()}")
    versions = parse_index_versions(proc.stdout)
    if not versions:
        raise PatchcraftError(
            f"pip index versions {package}: no release version in its output ({proc.stdout.strip()[:200]!r})"
        )
    return versions[0]
