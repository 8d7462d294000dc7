"""lazy.py: a command loads only what it needs.

A single-file run imports neither the runner transform, nor the worker
pool (``multiprocessing``), nor rich: traced with ``-X importtime`` on the
release copies of conftest.py (SMALL_RELEASE, 0.5.2). A cache hit imports no libcst
(test_cache.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_single_file_run_loads_only_what_it_uses(package: Path) -> None:
    """One staged model file: no runner transform (no runner row), no worker pool, no rich."""
    env = {**os.environ, "PATCHCRAFT_NO_CACHE": "1", "NO_COLOR": "1"}
    target = package / "srt" / "models" / "llama.py"
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "patchcraft", "verify", str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "patchcraft.transforms.capture_embedding_output" in imported  # the trace works
    assert not {"patchcraft.transforms.configure_ids_before_graphs", "multiprocessing", "rich"} & imported
