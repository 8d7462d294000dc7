"""Crash safety: SIGKILL ``patchcraft apply`` at random moments, hundreds of times.

See crash_campaign.py for the method. Figures: runs, outcomes, files lost
(must be 0), re-runs that did not complete the job (must be 0).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from crash_campaign import calibrate, campaign, make_lanes, subprocess_runs
from reliability_kit import record

#: The campaign's size per tier: the fast tier's draws still reach the write window; the full tier is the campaign.
#: ``PATCHCRAFT_CRASH_RUNS`` sets the full tier's (scripts/reliability_report.py's figures).
FAST_RUNS = 24
FULL_RUNS = int(os.environ.get("PATCHCRAFT_CRASH_RUNS", "200"))
SEED = 20250605


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize(
    "runs", [pytest.param(FAST_RUNS, id="fast"), pytest.param(FULL_RUNS, id="full", marks=pytest.mark.slow)]
)
def test_sigkill_at_random_moments_loses_nothing(tmp_path: Path, runs: int) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    lanes = make_lanes(tmp_path, count=2)
    calibrate(lanes)
    assert lanes[0].patched == lanes[1].patched, "apply is not deterministic"
    figures = campaign(lanes, runs, rng)
    console = subprocess_runs(lanes[0], kills=3, rng=rng)
    elapsed = time.monotonic() - started
    record(
        "crash" if runs == FULL_RUNS else "crash_fast",
        {
            **figures.as_dict(),
            "seed": SEED,
            "lanes": len(lanes),
            "console_script": console,
            "test_seconds": round(elapsed, 1),
        },
    )

    assert figures.runs == runs
    assert figures.lost == 0, figures.lost_files[:3]
    assert not figures.rerun_failures, figures.rerun_failures[:3]
    assert not figures.exit_mismatches, figures.exit_mismatches[:3]
    assert console["lost"] == 0
    # The draws really reached the dangerous window: some kills landed mid-write.
    assert figures.outcomes["killed between two file replacements"] > 0, figures.outcomes


def _torn_writer() -> None:
    """A deliberately unsafe writer for the child: in place, pausing half-way.

    It marks its write phase with a temporary-file name, as the real writer's
    temporary files do, so that the same kill schedule applies.
    """
    import patchcraft.engine.tree_run as engine

    def torn(items):
        for source, text in items:
            marker = source.path.parent / f".{source.path.name}.abcdefgh.patchcraft"
            marker.write_bytes(b"")
            data = source.encode(text)
            with open(source.path, "wb") as handle:
                handle.write(data[: len(data) // 2])
                handle.flush()
                time.sleep(0.2)
                handle.write(data[len(data) // 2 :])
            marker.unlink()

    engine.write_all = torn


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_the_check_catches_a_non_atomic_writer(tmp_path: Path) -> None:
    """The same harness, pointed at an in-place writer, must report torn files."""
    rng = random.Random(SEED)
    lanes = make_lanes(tmp_path, count=1, keep=("llama",))
    calibrate(lanes, sabotage=_torn_writer)
    figures = campaign(lanes, 15, rng, sabotage=_torn_writer, until_lost=True)
    record("crash_self_test", {"runs": figures.runs, "lost": figures.lost})
    assert figures.lost > 0, figures.outcomes
