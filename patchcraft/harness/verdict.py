"""A harness row as the record a model's proof keeps: status, failed scenario, and what it means for the server.

torch-free: the pipeline turns the rows of a run it already made into
:class:`~patchcraft.engine.records.HarnessVerdict` records, and everything
downstream (withholding, the advice for a refused hand fix) reads their
fields, never the row's message.
"""

from __future__ import annotations

from typing import Protocol

from patchcraft.base.status import HarnessStatus
from patchcraft.engine.records import HarnessVerdict

#: The harness scenario (docs/harness.md) that failed -> what it means for the server.
CONSEQUENCES = {
    "pipeline": "at PP > 1 later stages capture the wrong tensor (no first-stage gate)",
    "init": "the forward reads a flag no __init__ sets: it crashes at start-up (AttributeError)",
    "capture": "with -1 in the ids the draft is fed the wrong hidden states",
    "same": "without -1 the capture differs from the unpatched release: drafts that never ask for -1 break too",
    "default": "with no ids configured the capture differs from the unpatched release",
    "vllm-id-0": "with id 0 in the ids the draft is not fed a copy of the embedding output (hs[0])",
    "vllm-same": "without id 0 the capture differs from the unpatched release: drafts that never ask for 0 break too",
}
UNKNOWN_CONSEQUENCE = "the draft is fed the wrong hidden states"


class Row(Protocol):
    """What a harness row (:class:`patchcraft.harness.runner.SmokeResult`) offers a verdict."""

    @property
    def status(self) -> HarnessStatus: ...
    @property
    def message(self) -> str: ...
    @property
    def scenario(self) -> str: ...


def verdict_of(row: Row) -> HarnessVerdict:
    """The record of ``row``: its status, its words, the scenario that failed first and its consequence."""
    failed = row.status in (HarnessStatus.FAIL, HarnessStatus.ERROR)
    return HarnessVerdict(
        status=HarnessStatus(row.status),
        message=row.message,
        scenario=row.scenario,
        consequence=CONSEQUENCES.get(row.scenario, UNKNOWN_CONSEQUENCE) if failed else "",
    )
