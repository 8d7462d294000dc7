"""Forks of SGLang published on PyPI under their own names, fetched as the suite fetches releases.

Each of them installs an ``sglang/`` package from a distribution that is not
``sglang`` (docs/forks.md, "Installed forks"): KTransformers'
``sglang-kt`` (``sglang_kt-0.7.2.dist-info``), ``lsglang``. Their wheels are
downloaded with ``pip download --no-deps`` into the suite's ``wheels/``
(shared with the user's store like a release's: suite_cache), never kept
in this repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import suite_cache
from patchcraft.base.fetch import cache_dir, download_wheel, unpack

#: ``(distribution as wheel files spell it, version)`` of each fork a test reads.
SGLANG_KT = ("sglang_kt", "0.7.2")
LSGLANG = ("lsglang", "1.6.5")


def fork_wheel(fork: tuple[str, str]) -> Path:
    """The fork's wheel in the suite's cache, downloaded on first use (one download across xdist workers)."""
    distribution, version = fork
    with suite_cache.release_lock(f"{distribution}-{version}"):
        return download_wheel(version, cache_dir() / "wheels", distribution)


def unpacked_fork(fork: tuple[str, str], dest: Path) -> Path:
    """The fork's ``sglang/`` Python sources unpacked into ``dest/sglang`` (each checked against its RECORD)."""
    return unpack(fork_wheel(fork), dest)


def install_fork(fork: tuple[str, str], site: Path) -> Path:
    """``pip install --no-deps --target SITE`` of the fork's wheel, as a user's server has it; its ``sglang`` package.

    The dist-info folder pip writes (RECORD included) lies beside the package.
    """
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site)]
    subprocess.run([*command, str(fork_wheel(fork))], check=True, env=env, capture_output=True)
    return site / "sglang"
