"""What one harness run of a setter and a forward gave, as plain records (no torch: a cached run is read without it).

:mod:`patchcraft.harness.served` makes them by running the code;
:mod:`patchcraft.harness.run_cache` keeps them (``outcome_data`` and
``outcome_of`` turn one into JSON data and back); ``explain``'s text reads
them (``fed_text``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CANNOT_RUN", "NOT_RUN", "Fed", "RunOutcome", "fed_text", "outcome_data", "outcome_of"]

#: Where the harness cannot follow a model, the answer is this prefix and the reason.
NOT_RUN = "not run"
#: Where what failed was a stand-in (not SGLang's code on SGLang's values): this prefix and the reason.
CANNOT_RUN = "cannot be run here"


@dataclass(frozen=True)
class Fed:
    """One aux state as it reached the collector."""

    state: int | None  # hs index; None: a tensor that is no hidden state of the reference
    copy: bool  # False: it shares storage with the embedding output (overwritten in place later)
    what: str = ""  # for an unknown tensor: what it is (e.g. a layer's output without its residual)


@dataclass(frozen=True)
class RunOutcome:
    """What running the setter and the forward with one id list gave."""

    fed: tuple[Fed, ...] = ()
    crash: str = ""  # "TypeError: ... at deepseek_v2.py:2446 in forward"; "" when it ran
    stage: str = ""  # "setter" or "forward": where the crash happened
    not_run: str = ""  # why the harness could not run this model ("" when it ran)

    @property
    def ran(self) -> bool:
        return not self.not_run

    @property
    def harness_limit(self) -> bool:
        """It failed on a stand-in: no claim about SGLang, the static reading answers."""
        return self.not_run.startswith(CANNOT_RUN)

    @property
    def states(self) -> tuple[int, ...]:
        """The hs indices fed, in order (an unknown tensor counts as -1)."""
        return tuple(-1 if f.state is None else f.state for f in self.fed)

    @property
    def all_copies(self) -> bool:
        return all(f.copy for f in self.fed)

    @property
    def nothing(self) -> bool:
        """It ran without a crash and nothing reached the collector."""
        return self.ran and not self.crash and not self.fed


def outcome_data(outcome: RunOutcome) -> dict:
    """``outcome`` as JSON data (:func:`outcome_of` reads it back)."""
    return {
        "fed": [[f.state, f.copy, f.what] for f in outcome.fed],
        "crash": outcome.crash,
        "stage": outcome.stage,
        "not_run": outcome.not_run,
    }


def outcome_of(data: Any) -> RunOutcome:
    """The outcome :func:`outcome_data` wrote (any other shape raises)."""
    fed = tuple(Fed(None if state is None else int(state), bool(copy), str(what)) for state, copy, what in data["fed"])
    return RunOutcome(fed, str(data["crash"]), str(data["stage"]), str(data["not_run"]))


def fed_text(outcome: RunOutcome) -> str:
    """``hs[0] (not a copy), hs[3], hs[31]``, the crash, or ``nothing``."""
    if outcome.not_run:
        return outcome.not_run
    if outcome.crash:
        return f"crash in the {outcome.stage}: {outcome.crash}"
    items = []
    for f in outcome.fed:
        name = f"hs[{f.state}]" if f.state is not None else f.what
        items.append(name if f.copy else f"{name} (not a copy: layer 0 overwrites it in place)")
    return ", ".join(items) if items else "nothing"
