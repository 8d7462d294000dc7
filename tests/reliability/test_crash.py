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

from crash_campaign import BETWEEN, calibrate, campaign, make_lanes, subprocess_runs
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
def test_sigkill_at_random_moments_loses_nothing(disk_tmp_path: Path, runs: int) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    lanes = make_lanes(disk_tmp_path, count=2)
    calibrate(lanes)
    assert lanes[0].patched == lanes[1].patched, "apply is not deterministic"
    figures = campaign(lanes, runs, rng, top_up=runs)
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

    assert figures.runs == runs + figures.top_ups and figures.top_ups <= runs
    assert figures.lost == 0, figures.lost_files[:3]
    assert not figures.rerun_failures, figures.rerun_failures[:3]
    assert not figures.exit_mismatches, figures.exit_mismatches[:3]
    assert console["lost"] == 0
    # The draws really reached the dangerous window: some kills landed mid-write (within ``runs`` more draws when
    # a loaded machine made the first ``runs`` miss it).
    assert figures.outcomes[BETWEEN] > 0, figures.outcomes


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_campaign_whose_draws_all_miss_the_window_draws_again(disk_tmp_path: Path, monkeypatch) -> None:
    """The first runs are made to miss (never killed, as when the watching parent is scheduled too late): without
    ``top_up`` nothing lands between two replacements and the guard above would fail; with it, more runs are drawn
    until one does, each checked as the others are."""
    import crash_campaign

    schedule = crash_campaign._schedule
    missed = {"left": 4}

    def late(lane, rng, figures, sabotage):
        schedule(lane, rng, figures, sabotage)
        if missed["left"]:
            missed["left"] -= 1
            lane.job.after_write = lane.job.after_rename = None
            lane.job.deadline = lane.job.started + 3600.0  # it exits first

    monkeypatch.setattr(crash_campaign, "_schedule", late)
    lanes = make_lanes(disk_tmp_path, count=2)
    calibrate(lanes)
    rng = random.Random(SEED)
    alone = campaign(lanes, 4, rng)
    assert alone.outcomes == {"exited before the kill": 4} and alone.top_ups == 0
    missed["left"] = 4
    topped = campaign(lanes, 4, rng, top_up=40)
    assert topped.outcomes["exited before the kill"] >= 4 and topped.top_ups >= 1
    assert topped.outcomes[BETWEEN] > 0, topped.outcomes
    assert topped.runs == 4 + topped.top_ups and topped.lost == 0 and not topped.rerun_failures


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
def test_the_check_catches_a_non_atomic_writer(disk_tmp_path: Path) -> None:
    """The same harness, pointed at an in-place writer, must report torn files."""
    rng = random.Random(SEED)
    lanes = make_lanes(disk_tmp_path, count=1, keep=("llama",))
    calibrate(lanes, sabotage=_torn_writer)
    figures = campaign(lanes, 15, rng, sabotage=_torn_writer, until_lost=True)
    record("crash_self_test", {"runs": figures.runs, "lost": figures.lost})
    assert figures.lost > 0, figures.outcomes
