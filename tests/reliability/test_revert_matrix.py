"""Revert after apply is byte-identical on every file of every release in the matrix.

Whatever the engine patches today (coverage grows release by release),
``apply`` then ``revert`` must give back the release exactly: every file
of the copied tree (models, model executor, the rest) is compared byte for
byte. ``revert`` on a pristine release changes nothing. Releases run two
at a time, one per core.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from pathlib import Path

import pytest

from patchcraft.engine.tree_run import run, write_changes
from patchcraft.engine.records import Mode
from patchcraft.base.target import resolve_target
from reliability_kit import MATRIX, copy_release, record, snapshot


def apply_then_revert(version: str) -> dict:
    started, cpu = time.monotonic(), time.process_time()
    with tempfile.TemporaryDirectory(prefix=f"revert-{version}-") as base:
        package = copy_release(version, Path(base))
        original = snapshot(package)
        tree = resolve_target(str(package))
        untouched = run(tree, Mode.REVERT).changes
        applied = run(tree, Mode.APPLY)
        write_changes(applied.changes)
        patched = snapshot(package)
        reverted = run(tree, Mode.REVERT)
        write_changes(reverted.changes)
        final = snapshot(package)
    differing = sorted(rel for rel in set(original) | set(final) if original.get(rel) != final.get(rel))
    return {
        "files": len(original),
        "patched_by_apply": sum(1 for rel in original if patched.get(rel) != original[rel]),
        "reverted": len(reverted.changes),
        "not_identical_after_revert": len(differing),
        "differing": differing[:5],
        "revert_on_pristine_changes": len(untouched),
        "seconds": round(time.monotonic() - started, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
    }


@pytest.mark.slow  # the fast tier: test_release_history.py's static sweep reverts every minor release through the CLI
def test_apply_then_revert_is_byte_identical_on_every_release() -> None:
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = dict(zip(MATRIX, pool.map(apply_then_revert, MATRIX)))
    record("revert", results)
    for version, found in results.items():
        assert found["not_identical_after_revert"] == 0, (version, found["differing"])
        assert found["revert_on_pristine_changes"] == 0, version
        assert found["reverted"] == found["patched_by_apply"], (version, found)
    assert sum(found["patched_by_apply"] for found in results.values()) > 0
