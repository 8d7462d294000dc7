"""A smoke run of bench/probe.py on a tiny draft: both rows are measured and printed; no figure is judged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_probe_benchmark_prints_both_rows() -> None:
    command = [sys.executable, str(ROOT / "bench" / "probe.py"), "--quick", "--tokens", "64", "--release", "0.5.10"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "| 4 states (24 wirings), served hs[3], hs[31], hs[59] | 24 | 64 |" in proc.stdout
    assert "| 3 states (6 orders) | 6 | 64 |" in proc.stdout
    assert "load average at the start" in proc.stdout
