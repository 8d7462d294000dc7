"""The formatter's check, in the suite: the code is as ``ruff format`` (pinned in the test extra) writes it.

Run ``python -m ruff format`` to fix a failure; the configuration (line
length 120) is ``[tool.ruff]`` in pyproject.toml.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    pytest.importorskip("ruff")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_code_is_formatted() -> None:
    check = ruff("format", "--check", ".")
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_check_fails_on_unformatted_code(tmp_path: Path) -> None:
    """The check itself: a file as ruff would not write it is named."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "bad.py").write_text("x = {  'a':1 }\n", encoding="utf-8")
    check = ruff("format", "--check", ".", cwd=tmp_path)
    assert check.returncode == 1 and "bad.py" in check.stdout + check.stderr
