"""What ``explain --engine vllm`` runs of one class, kept by the bytes it ran (no torch on a hit).

For one class of a vLLM tree, ``explain`` (and so ``check-draft --engine
vllm`` and ``run``'s vLLM preflight) finds the class on the platform asked,
reads its default ids by calling its getter, runs the setter and a forward
with the ids the runner sets, and then each id alone. :func:`class_runs` does
all of that once and keeps the result in :mod:`patchcraft.harness.run_cache`
under the content of every Python file of the parts of the vLLM package
patchcraft reads (:data:`patchcraft.base.vllm_fetch.PARTS`), the class, the
platform, the layer count, the ids and the getter; another copy of the same
release, or the same check again after a draft changed, answers from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from patchcraft.harness import run_cache
from patchcraft.harness.outcomes import RunOutcome, outcome_data, outcome_of


@dataclass(frozen=True)
class ClassRuns:
    """One class's harness part of a vLLM explanation."""

    #: Why the class could not be run ("" when it was), and whether that is because it is no EAGLE-3 target.
    error: str = ""
    not_a_target: bool = False
    label: str = ""
    outer_name: str = ""
    via: str = ""
    defaults: tuple[int, ...] = ()
    #: Why the defaults could not be read ("" when they were).
    why: str = ""
    served: tuple[int, ...] = ()
    outcome: RunOutcome = RunOutcome()
    #: For an entry that aliases the embedding: the state it holds after the forward, by position.
    holds: tuple[tuple[int, str], ...] = ()
    #: Each served id set alone, and what it fed.
    alone: tuple[tuple[int, RunOutcome], ...] = ()
    #: The config the runs assumed where the forward switches on it (Kimi-K3's attention residuals), and what
    #: that leaves unshown ("" when nothing was assumed).
    assumed: str = ""


def class_runs(
    package: Path,
    model_name: str,
    platform: Optional[str],
    num_layers: int,
    set_ids: Optional[tuple[int, ...]],
    getter: str,
) -> ClassRuns:
    """Find ``model_name`` on ``platform``, read its defaults and run ``set_ids`` (else the defaults), then each id alone."""
    asked = (model_name, platform, num_layers, set_ids, getter)
    found = run_cache.remembered(
        "vllm-explain",
        package,
        None,
        asked,
        lambda: _run(package, model_name, platform, num_layers, set_ids, getter),
        _data,
        _of,
        inputs=run_cache.VLLM_INPUTS,
    )
    assert found is not None
    return found


def _run(
    package: Path,
    model_name: str,
    platform: Optional[str],
    num_layers: int,
    set_ids: Optional[tuple[int, ...]],
    getter: str,
) -> ClassRuns:
    from patchcraft.harness.standins import HarnessError
    from patchcraft.harness.vllm_served import NotATarget, default_ids, find_model, run_ids

    try:
        model = find_model(package, model_name, platform=platform)  # a family's class on that platform
    except HarnessError as exc:
        return ClassRuns(error=str(exc), not_a_target=isinstance(exc, NotATarget))
    defaults, why = default_ids(model, getter, num_layers)
    served = set_ids if set_ids else defaults
    run = run_ids(model, served, num_layers)
    alone = tuple((i, run_ids(model, (i,), num_layers).outcome) for i in dict.fromkeys(served))
    return ClassRuns(
        label=model.label,
        outer_name=model.outer.name,
        via=model.via,
        defaults=tuple(defaults),
        why=why,
        served=tuple(served),
        outcome=run.outcome,
        holds=tuple(run.aliased_holds),
        alone=alone,
        assumed=_assumed(model),
    )


def _assumed(model: Any) -> str:
    """The side of a config switch the runs took (the harness's stand-ins are that side), said; "" for none."""
    from patchcraft.harness import attention_residuals, hyper_connections, switches

    if attention_residuals.reads_switch(model.graph, model.inner):
        return switches.ATTENTION_RESIDUALS.condition()
    if hyper_connections.mhc_switch(model.graph, model.inner):
        return switches.HYPER_CONNECTIONS.condition()
    return ""


def _data(runs: ClassRuns) -> dict:
    return {
        "error": runs.error,
        "not_a_target": runs.not_a_target,
        "label": runs.label,
        "outer_name": runs.outer_name,
        "via": runs.via,
        "defaults": list(runs.defaults),
        "why": runs.why,
        "served": list(runs.served),
        "outcome": outcome_data(runs.outcome),
        "holds": [[position, held] for position, held in runs.holds],
        "alone": [[i, outcome_data(outcome)] for i, outcome in runs.alone],
        "assumed": runs.assumed,
    }


def _of(data: Any) -> ClassRuns:
    return ClassRuns(
        error=str(data["error"]),
        not_a_target=bool(data["not_a_target"]),
        label=str(data["label"]),
        outer_name=str(data["outer_name"]),
        via=str(data["via"]),
        defaults=tuple(int(i) for i in data["defaults"]),
        why=str(data["why"]),
        served=tuple(int(i) for i in data["served"]),
        outcome=outcome_of(data["outcome"]),
        holds=tuple((int(position), str(held)) for position, held in data["holds"]),
        alone=tuple((int(i), outcome_of(outcome)) for i, outcome in data["alone"]),
        assumed=str(data["assumed"]),
    )
