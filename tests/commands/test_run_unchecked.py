"""``patchcraft run`` refuses what it cannot check: a draft whose training convention is not known is not launched.

The incident's config (``eagle_config`` ids ``[2, 30, 58]``, a SpecForge /
SGLang-format config, which names no training pipeline) launched as ok
without ``--trained-on``: only the shape was checked. Real subprocesses
over the cached 0.5.10 package (the "server" prints a line, so a launch
shows); the overlay cache is private to the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import release_package
from drafts import kimi_target, sglang_draft, speculators_draft


def run(tmp_path: Path, draft: Path, *options: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "patchcraft",
        "run",
        "--target",
        str(release_package("0.5.10")),
        "--no-smoke",
        *options,
        "--",
        sys.executable,
        "-c",
        "print('LAUNCHED')",
        "--model-path",
        str(kimi_target(tmp_path / "kimi")),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
    ]
    env = {**os.environ, "PATCHCRAFT_CACHE": str(tmp_path / "cache"), "HF_HUB_CACHE": str(tmp_path / "no-hub")}
    env.pop("PATCHCRAFT_NO_CACHE", None)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def test_the_incident_config_without_trained_on_is_not_launched(tmp_path: Path) -> None:
    proc = run(tmp_path, sglang_draft(tmp_path / "draft", [2, 30, 58]))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "LAUNCHED" not in proc.stdout
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "--trained-on" in lines[0] and "--no-preflight" in lines[0] and "not known" in lines[0]
    assert "ok" not in output.split()


def test_with_trained_on_the_same_draft_is_checked(tmp_path: Path) -> None:
    proc = run(tmp_path, sglang_draft(tmp_path / "draft", [2, 30, 58]), "--trained-on", "hf:0,3,31")
    assert proc.returncode == 1 and "LAUNCHED" not in proc.stdout  # the Kimi mismatch, with its fix
    assert "[-1, 2, 30]" in proc.stdout and "refused to launch" in proc.stderr


def test_a_config_that_names_its_pipeline_is_checked_by_the_convention_assumed(tmp_path: Path) -> None:
    proc = run(tmp_path, speculators_draft(tmp_path / "draft", [0, 3, 31, 59]))
    assert proc.returncode == 1 and "LAUNCHED" not in proc.stdout
    assert "assumed" in proc.stdout and "speculators_config" in proc.stdout  # the check ran, on the convention named
    assert "refused to launch" in proc.stderr


def test_no_preflight_stays_the_way_out(tmp_path: Path) -> None:
    proc = run(tmp_path, sglang_draft(tmp_path / "draft", [2, 30, 58]), "--no-preflight")
    assert proc.returncode == 0 and "LAUNCHED" in proc.stdout, proc.stderr
