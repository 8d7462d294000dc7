"""A harness row becomes a record: the status, the scenario that failed first, its consequence; no message parsed."""

from __future__ import annotations

import pytest

from patchcraft.base.status import HarnessStatus
from patchcraft.harness.verdict import CONSEQUENCES, UNKNOWN_CONSEQUENCE, verdict_of

pytest.importorskip("torch")  # the row type lives beside the scenarios, which import torch

from patchcraft.harness.runner import SmokeResult  # noqa: E402
from patchcraft.harness.scenarios import Check  # noqa: E402

FAIL, ERROR, PASS = HarnessStatus.FAIL, HarnessStatus.ERROR, HarnessStatus.PASS


def _row(status: HarnessStatus, *checks: Check, message: str = "") -> SmokeResult:
    return SmokeResult("m.M", "m.py", status, message, tuple(checks))


def test_the_first_failed_scenario_and_its_consequence_are_fields() -> None:
    # "capture" passed and "pipeline" failed, though the message names "capture" first: the field is the check's.
    row = _row(FAIL, Check("capture", PASS), Check("pipeline", FAIL, "x"), message="capture: not what failed")
    verdict = verdict_of(row)
    assert (verdict.status, verdict.scenario) == (FAIL, "pipeline")
    assert verdict.consequence == CONSEQUENCES["pipeline"] and verdict.message == row.message


def test_a_row_that_could_not_be_set_up_has_no_scenario() -> None:
    verdict = verdict_of(_row(ERROR, message="pipeline: words that look like a scenario"))
    assert verdict.scenario == "" and verdict.consequence == UNKNOWN_CONSEQUENCE


def test_a_passed_row_has_no_consequence() -> None:
    verdict = verdict_of(_row(PASS, Check("capture", PASS), message="all scenarios pass"))
    assert (verdict.status, verdict.scenario, verdict.consequence) == (PASS, "", "")
