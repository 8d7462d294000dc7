"""A harness run's outcome as a plain record (patchcraft.harness.outcomes): kept as JSON and read back whole."""

from __future__ import annotations

import json

import pytest

from patchcraft.harness.outcomes import Fed, RunOutcome, fed_text, outcome_data, outcome_of

OUTCOMES = [
    RunOutcome(fed=(Fed(0, False), Fed(3, True), Fed(None, True, "layer 2's output without its residual"))),
    RunOutcome(crash="TypeError: unsupported operand at deepseek_v2.py:2446 in forward", stage="forward"),
    RunOutcome(not_run="cannot be run here: a stand-in failed"),
    RunOutcome(),
]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=["fed", "crash", "not-run", "nothing"])
def test_an_outcome_comes_back_as_it_was(outcome: RunOutcome) -> None:
    again = outcome_of(json.loads(json.dumps(outcome_data(outcome))))
    assert again == outcome
    assert fed_text(again) == fed_text(outcome)


def test_another_shape_is_refused() -> None:
    with pytest.raises((KeyError, TypeError, ValueError)):
        outcome_of({"fed": [[0, True]], "crash": "", "stage": "", "not_run": ""})


def test_the_text_says_what_was_fed() -> None:
    assert fed_text(OUTCOMES[0]) == (
        "hs[0] (not a copy: layer 0 overwrites it in place), hs[3], layer 2's output without its residual"
    )
    assert fed_text(OUTCOMES[1]).startswith("crash in the forward: TypeError")
    assert fed_text(OUTCOMES[3]) == "nothing"
