"""Fuzzing: 1,000 seeded structural mutations of real model files (see fuzz_corpus.py).

Every case ends patched (compiles, verified, idempotent; reverted byte for
byte on every fourth case), unchanged, or refused with the file untouched;
never a traceback, never exit 0 with a broken file.
"""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from fuzz_corpus import BASES, Tally, check_bases, run_cases
from reliability_kit import record

#: Cases per tier; ``PATCHCRAFT_FUZZ_CASES`` sets the full tier's (scripts/reliability_report.py's figures).
FAST_CASES = 120
FULL_CASES = int(os.environ.get("PATCHCRAFT_FUZZ_CASES", "1000"))
SEED = 1729
WORKERS = 2


def test_unmutated_bases_patch_cleanly() -> None:
    """The fuzzing starts from files the engine handles (else it proves little)."""
    found = check_bases()
    assert all(verdict == ("patched", "") for verdict in found.values()), found


@pytest.mark.parametrize(
    "cases", [pytest.param(FAST_CASES, id="fast"), pytest.param(FULL_CASES, id="full", marks=pytest.mark.slow)]
)
def test_structural_mutations_never_break_a_file(cases: int) -> None:
    started = time.monotonic()
    chunks = [list(range(worker, cases, WORKERS)) for worker in range(WORKERS)]
    with multiprocessing.get_context("fork").Pool(WORKERS) as pool:
        parts = pool.starmap(run_cases, [(chunk, SEED) for chunk in chunks])
    tally = Tally()
    for part in parts:
        tally.merge(part)
    record(
        "fuzz" if cases == FULL_CASES else "fuzz_fast",
        {
            "cases": tally.cases,
            "seed": SEED,
            "bases": [f"{v}/{f}" + (f"+{t}" if t else "") for v, f, _, _, t in BASES],
            "verdicts": dict(tally.verdicts),
            "mutations": dict(tally.kinds),
            "per_base": {f"{label} {verdict}": n for (label, verdict), n in sorted(tally.per_base.items())},
            "violations": len(tally.violations),
            "test_seconds": round(time.monotonic() - started, 1),
        },
    )
    assert tally.cases == cases
    assert not tally.violations, tally.violations[:5]
    # The mutations reach all three verdicts, or the fuzzing is too tame (or too wild).
    assert {"patched", "refused", "unchanged"} <= set(tally.verdicts), tally.verdicts
