"""Every fix proven: the ways this install can feed a draft its training states, each checked again before it is offered.

A fix is an id list for the draft config and what it needs first:
nothing, ``patchcraft apply`` (or ``patchcraft run``), a server flag
(``--enforce-disable-flashinfer-allreduce-fusion``, ``--disable-cuda-graph``),
or the patch and a flag. Before a fix is offered it is applied (the ids
set in the draft config; the patch on a private copy of the install,
:mod:`patchcraft.analysis.applied`; the flag as the server's settings) and
the *whole* check runs again, through the ``recheck`` the caller hands in
(:func:`patchcraft.analysis.draft_check.check_draft`): ids, convention, the
run on the CPU harness, fc width, range, CUDA graphs and fusion at the
server's TP. A fix is offered only when that re-check has no FAIL, so the
first one printed clears every FAIL. When none passes, each way tried says
what blocks it.

Order, least invasive first: ids alone; with ``patchcraft apply`` (it
keeps every layer's fused kernel but those captured); with the fusion flag
(every layer loses the fused all-reduce); with ``--disable-cuda-graph``
(every decode step runs eagerly). A later fix with the same ids and a
superset of what an earlier one needs is dropped.

Candidates: the draft's own ids first (a fix that needs only the patch or a
flag keeps them), then the two id conventions for the wanted states
(``e - 1`` and ``e`` for ``hs[e]``, ``-1`` and ``0`` for the embedding).
The static reading only prunes the candidates that cannot feed the wanted
states; a fix is proven by the re-check (by running the code when torch is
there, else by the static reading, which fails what it cannot tell).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Protocol, Sequence

from patchcraft.analysis.applied import applied_model
from patchcraft.analysis.target_model import RUN, Model, serve, states_text
from patchcraft.base.errors import PatchcraftError

#: Longest training list searched (2**8 candidate lists at most per way).
MAX_STATES = 8
#: The server flags a fix may name.
FUSION_FLAG = "--enforce-disable-flashinfer-allreduce-fusion"
CUDA_GRAPH_FLAG = "--disable-cuda-graph"
#: The check each flag can clear.
_CLEARS = {"fusion": FUSION_FLAG, "cuda-graph": CUDA_GRAPH_FLAG}
#: At most this many fixes are offered.
MAX_FIXES = 3


@dataclass(frozen=True)
class Serving:
    """How the server runs, as far as the check is concerned."""

    tp: int = 1
    cuda_graph: bool = True  # False: --disable-cuda-graph
    allreduce_fusion: bool = True  # False: --enforce-disable-flashinfer-allreduce-fusion

    def with_flags(self, flags: Sequence[str]) -> Serving:
        return replace(
            self,
            cuda_graph=self.cuda_graph and CUDA_GRAPH_FLAG not in flags,
            allreduce_fusion=self.allreduce_fusion and FUSION_FLAG not in flags,
        )


class CheckResult(Protocol):
    """One line of the check (:class:`patchcraft.analysis.draft_check.Check`)."""

    @property
    def name(self) -> str: ...

    @property
    def ok(self) -> bool | None: ...

    @property
    def message(self) -> str: ...


@dataclass(frozen=True)
class Recheck:
    """The whole check run again for one fix: its lines, the setter's rule for the ids, and how it was proven."""

    checks: tuple[CheckResult, ...]
    rule: str
    proof: str  # RUN: the code ran on the CPU harness; STATIC: read by rules

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.ok is False)


#: ``recheck(model, ids, serving)``: the whole check with the draft config's ids set to ``ids``.
Rechecker = Callable[[Model, tuple[int, ...], Serving], Recheck]


@dataclass(frozen=True)
class Fix:
    """One way to feed the training states, proven by the whole check passing with it."""

    ids: tuple[int, ...]
    after_apply: bool  # True: only after `patchcraft apply` (or through `patchcraft run`)
    proof: str  # RUN: the re-check ran the code on the CPU harness; STATIC: read by rules (no torch)
    #: Server flags the fix needs (FUSION_FLAG, CUDA_GRAPH_FLAG).
    flags: tuple[str, ...] = ()
    #: ``hf:I,J,K`` to pass as --trained-on from then on: the convention read the config, and the ids change.
    trained_on: str = ""
    #: How the install reads these ids (the setter's rule on this release).
    rule: str = field(default="", compare=False)
    #: -1 on patchcraft's setter: the other ids are layer outputs on every release (by construction).
    portable: bool = field(default=False, compare=False)

    @property
    def native(self) -> bool:
        return not self.after_apply

    @property
    def needs(self) -> frozenset[str]:
        return frozenset(self.flags) | ({"apply"} if self.after_apply else set())

    @property
    def cost(self) -> tuple[bool, bool, bool]:
        return (CUDA_GRAPH_FLAG in self.flags, FUSION_FLAG in self.flags, self.after_apply)


@dataclass(frozen=True)
class Blocked:
    """A way that was tried and what fails with it (the first id list tried that way; ``others`` more failed too)."""

    way: str
    why: str
    others: int = 0


@dataclass(frozen=True)
class Proven:
    """The fixes that pass the whole check, least invasive first; what blocks the others."""

    fixes: tuple[Fix, ...] = ()
    blocked: tuple[Blocked, ...] = ()


def prove(
    model: Model,
    wanted: Sequence[int] | None,
    current: tuple[int, ...] | None,
    num_layers: int,
    serving: Serving,
    recheck: Rechecker,
    pin: Callable[[tuple[int, ...]], str] = lambda ids: "",
) -> Proven:
    """The fixes for ``model``'s install that feed ``wanted`` (None: not known; the draft's own ids are kept).

    ``pin(ids)``: the ``--trained-on hf:...`` to use once the config holds ``ids`` ("" when the
    convention does not move with the config).
    """
    wanted = tuple(wanted) if wanted is not None else None
    if wanted is not None and (not wanted or list(wanted) != sorted(set(wanted)) or len(wanted) > MAX_STATES):
        return Proven()
    if wanted is None and current is None:
        return Proven()
    ways: list[tuple[bool, Model]] = [(False, model)]
    applied = applied_model(model)
    if applied.model is not None:
        ways.append((True, applied.model))
    found: list[tuple[int, Fix]] = []
    blocked: list[Blocked] = []
    for after_apply, state in ways:
        flags = available_flags(state, serving)
        tried, failures, first = False, 0, Blocked("", "")
        for order, ids in enumerate(_candidates(wanted, current)):
            if wanted is not None and not _plausible(state, ids, wanted, num_layers):
                continue
            tried = True
            fix, why = _proof(state, ids, after_apply, serving, flags, recheck)
            if fix is not None:
                found.append((order, replace(fix, trained_on=pin(ids))))
                if not fix.flags:  # nothing later in this way is less invasive
                    break
            elif failures:
                failures += 1
            else:
                failures, first = 1, Blocked(_way(ids, after_apply), why)
        if failures:
            blocked.append(replace(first, others=failures - 1))
        if not tried and wanted is not None:
            detail = f" ({state.patch_detail})" if 0 in wanted and not state.patched else ""
            blocked.append(Blocked(_way(None, after_apply), f"no id list makes it feed {states_text(wanted)}{detail}"))
    if not applied.model and not model.patched and applied.why:
        blocked.append(Blocked("after `patchcraft apply`", applied.why))
    fixes = _least_invasive(found)
    return Proven(fixes, () if fixes else tuple(blocked))


def available_flags(model: Model, serving: Serving) -> dict[str, str]:
    """The check name -> the server flag that clears it, for the flags this release has and the server lacks."""
    flags = {}
    if serving.cuda_graph:
        flags["cuda-graph"] = CUDA_GRAPH_FLAG
    if serving.tp > 1 and serving.allreduce_fusion and has_fusion_flag(model):
        flags["fusion"] = FUSION_FLAG
    return flags


def has_fusion_flag(model: Model) -> bool:
    from patchcraft.transforms.keep_captured_states_reduced import has_enforce_flag

    return has_enforce_flag(model.tree.package)


def _proof(
    state: Model, ids: tuple[int, ...], after_apply: bool, serving: Serving, flags: dict[str, str], recheck: Rechecker
) -> tuple[Fix | None, str]:
    """The fix ``ids`` make on ``state`` (with the fewest flags), proven by the re-check; else what blocks them."""
    result = recheck(state, ids, serving)
    needed = tuple(flags.get(c.name, "") for c in result.failed)
    if result.failed and not all(needed):
        return None, _why(result.failed)
    if needed:
        result = recheck(state, ids, serving.with_flags(needed))
        if result.failed:
            return None, _why(result.failed)
    portable = -1 in ids and (after_apply or state.patched)
    ordered = tuple(f for f in (FUSION_FLAG, CUDA_GRAPH_FLAG) if f in needed)
    return Fix(ids, after_apply, result.proof, ordered, rule=result.rule, portable=portable), ""


def _why(failed: Sequence[CheckResult]) -> str:
    """The first check that fails, in full, and the names of the others."""
    also = f" (also failing: {', '.join(c.name for c in failed[1:])})" if len(failed) > 1 else ""
    return f"{failed[0].name}: {failed[0].message}{also}"


def _way(ids: tuple[int, ...] | None, after_apply: bool) -> str:
    where = "after `patchcraft apply`" if after_apply else "this install as it is"
    return f"{list(ids)} {where}" if ids is not None else where


def _least_invasive(found: Sequence[tuple[int, Fix]]) -> tuple[Fix, ...]:
    kept: list[Fix] = []
    for _, fix in sorted(found, key=lambda item: (item[1].cost, item[0])):
        if any(k.ids == fix.ids and fix.needs >= k.needs for k in kept):
            continue
        kept.append(fix)
    return tuple(kept[:MAX_FIXES])


def _candidates(wanted: tuple[int, ...] | None, current: tuple[int, ...] | None) -> Iterator[tuple[int, ...]]:
    """The draft's own ids, then the +1 reading (``e - 1``, ``-1`` for the embedding), then the raw one."""
    seen = set()
    choices = [(e - 1, e) if e > 0 else (-1, 0) for e in wanted] if wanted is not None else []
    for ids in itertools.chain(
        [current] if current is not None else [], itertools.product(*choices) if choices else []
    ):
        if ids not in seen:
            seen.add(ids)
            yield tuple(ids)


def _plausible(model: Model, ids: tuple[int, ...], wanted: tuple[int, ...], num_layers: int) -> bool:
    """Whether the static reading lets ``ids`` feed ``wanted`` (or cannot tell): only then is the check run."""
    try:
        static = serve(model, ids, num_layers)
    except PatchcraftError:
        return False
    return bool(static.unknown) or (static.states == wanted and not static.run.error)


__all__ = ["RUN", "Blocked", "Fix", "Proven", "Recheck", "Serving", "prove"]
