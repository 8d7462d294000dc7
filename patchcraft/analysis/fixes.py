"""The least invasive fix: every way this install can feed a draft its training states.

A draft trained on Hugging Face states ``wanted`` (``hs[0]`` the
embedding, ``hs[k]`` the output of layer ``k-1``) can be served on one
install in up to two ways:

1. ids for the install as it is, with no patch: the release's own setter
   and forward may already feed them (``[0, 3, 31]`` on the DeepseekV2
   family from 0.5.14, where the first-id heuristic keeps ids raw and the
   release's capture at layer 0 copies the embedding);
2. ids after ``patchcraft apply`` (or ``patchcraft run``), where ``-1``
   is the embedding and the rest follow the +1 rule on every release.

Each way is proven by running the code on the CPU harness when torch is
there (:func:`patchcraft.analysis.explain.run_served`); without it the static
reading answers, and never for a case it marks unknown. Candidates come
from the two id conventions (``e - 1`` and ``e`` for ``hs[e]``, ``-1`` and
``0`` for the embedding); the static reading only orders the search, it
proves nothing by itself when the code can run.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator, Sequence

from patchcraft.analysis.target_model import RUN, STATIC, Model, apply_helps, run_served, serve

#: Longest training list searched (2**8 candidate lists at most per way).
MAX_STATES = 8


@dataclass(frozen=True)
class Fix:
    """One id list that feeds the wanted states, and what it needs first."""

    ids: tuple[int, ...]
    after_apply: bool  # True: only after `patchcraft apply` (or through `patchcraft run`)
    proof: str  # RUN: the harness ran it; STATIC: read by rules (no torch)

    @property
    def native(self) -> bool:
        return not self.after_apply


def fixes(model: Model, wanted: Sequence[int], num_layers: int) -> tuple[Fix, ...]:
    """The ways to feed ``wanted``: ids for the install as it is first, then after apply."""
    wanted = tuple(wanted)
    if not wanted or list(wanted) != sorted(set(wanted)) or len(wanted) > MAX_STATES:
        return ()
    ways = [False] + ([True] if not model.patched and apply_helps(model) else [])
    found = []
    for after_apply in ways:
        fix = _first(model, wanted, num_layers, after_apply)
        if fix is not None:
            found.append(fix)
    return tuple(found)


def _candidates(wanted: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """The +1 reading first (``e - 1``, ``-1`` for the embedding), then the raw one."""
    choices = [(e - 1, e) if e > 0 else (-1, 0) for e in wanted]
    return itertools.product(*choices)


def _first(model: Model, wanted: tuple[int, ...], num_layers: int, after_apply: bool) -> Fix | None:
    for candidate in _candidates(wanted):
        static = serve(model, candidate, num_layers, after_apply=after_apply)
        plausible = static.unknown or (static.states == wanted and not static.run.error)
        if not plausible:
            continue
        outcome = run_served(model, candidate, num_layers, after_apply=after_apply)
        if outcome is not None and outcome.ran:
            if not outcome.crash and outcome.states == wanted and outcome.all_copies:
                return Fix(candidate, after_apply, RUN)
        elif not static.unknown and not static.unsafe_embedding:
            return Fix(candidate, after_apply, STATIC)
    return None
