"""mypy on ``patchcraft`` and ``transforms``: the README's test command runs it, so CI does (issue 17, item 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_is_clean() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "patchcraft", "transforms"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mypy reports errors:\n{proc.stdout}{proc.stderr}"
