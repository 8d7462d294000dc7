"""Which hidden states does SGLang really capture for a list of aux layer ids?

The answer depends on the release and the model: the setter's id
conversion (+1 rule, first-id or max heuristic, inner helper, delegation),
which boundaries the inner model's ``forward`` can capture, whether the
install is patched for -1, and whether the model runner resets the ids
before CUDA-graph capture. This module composes the answer from three steps,
each its own function, so that what runs code is called by name:

- :func:`read_ids`, the static reading: the setter that really runs, executed on
  stand-ins, against what the forward captures (:func:`patchcraft.analysis.target_model.serve`),
  and the runner's resets (:func:`patchcraft.planning.runner_resets.runner_resets`);
- :func:`run_harness`, the CPU harness (torch): the same ids run through the
  install's setter and forward, when torch is there;
- :func:`explanation`, which runs nothing on the harness (it is handed what ran): the
  record ``explain`` prints, its rows, warnings and notes worded by
  :mod:`patchcraft.analysis.explain_findings`.

:func:`explain` is the three in a row. The model and its patch state are
:func:`patchcraft.analysis.target_model.load_model`'s. Hidden states are
numbered as Hugging Face does: ``hs[0]`` is the embedding output and
``hs[k]`` the output of decoder layer ``k-1``. A ``layers_to_capture``
value ``v`` is boundary ``v``: a capture at the top of layer ``v`` (or after
layer ``v-1``) yields ``hs[v]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from patchcraft.analysis.explain_findings import Facts, Finding, FindingKind, IdRow, heuristic_words, id_rows, judge
from patchcraft.analysis.target_model import (
    RUN,
    STATIC,
    Model,
    Served,
    FusionCost,
    apply_helps,
    fusion_cost,
    fusion_defect,
    run_served,
    serve,
)
from patchcraft.base.errors import PatchcraftError
from patchcraft.planning.id_source import IdSource, IdSourceKind
from patchcraft.planning.runner_resets import RunnerReset, runner_resets
from patchcraft.reading.capture_reading import conversion_rule, setter_variant

if TYPE_CHECKING:
    from patchcraft.harness.outcomes import RunOutcome


@dataclass(frozen=True)
class Explanation:
    """Everything ``patchcraft explain`` reports for one model and one id list."""

    version: str
    package: str
    model: str
    setter: str
    calls: tuple[str, ...]
    variant: str
    rule: str
    patched: bool
    patch_detail: str
    num_layers: int
    layer_ids: tuple[int, ...] | None
    layers_to_capture: tuple[int, ...] | None
    embedding: bool
    rows: tuple[IdRow, ...]
    served: tuple[int, ...]
    default_served: tuple[int, ...]
    resets: tuple[RunnerReset, ...]
    warnings: tuple[Finding, ...]
    notes: tuple[str, ...]
    #: ``run`` (the setter and forward ran on the CPU harness) or ``static`` (read by rules).
    source: str = STATIC
    #: The run with these ids (None: static), and what the static reading says.
    outcome: "RunOutcome | None" = None
    static_served: tuple[int, ...] = ()
    static_unknown: str = ""
    #: Why the harness did not run the code though torch is there ("" when it ran or torch is missing):
    #: ``cannot be run here: ...`` when what failed was a stand-in, not SGLang's code.
    not_run: str = ""
    #: Where this tree's runner reads the ids it passes to the setter (the draft config, a server flag, none).
    id_source: IdSource | None = None
    #: At TP > 1: the layers that lose FlashInfer's fused all-reduce to keep the captured states reduced.
    fusion_cost: FusionCost | None = None
    #: False: the server runs with --enforce-disable-flashinfer-allreduce-fusion (``--no-allreduce-fusion``).
    allreduce_fusion: bool = True

    @property
    def static_why(self) -> str:
        """Why the served states are the static reading's (check-draft's ``run`` row)."""
        if self.not_run:
            return f"static reading: {self.not_run}"
        return "static reading: the code was not run (install torch to run it on the CPU harness)"

    def findings(self, *kinds: FindingKind) -> list[Finding]:
        return [w for w in self.warnings if w.kind in kinds]

    @property
    def graph_reset(self) -> bool:
        """CUDA-graph replays will capture the default layers instead."""
        return bool(self.resets)


@dataclass(frozen=True)
class IdsReading:
    """The static reading of one id list on one model: nothing run but the setter, on stand-ins."""

    model: Model
    ids: tuple[int, ...] | None
    num_layers: int
    #: Tensor parallelism the server runs with (all-reduce fusion matters only above 1).
    tp: int
    #: What these ids serve, and what the default call (no ids) serves, read by rules.
    served: Served
    default: Served
    #: The model runner's calls that reset the ids before CUDA-graph capture.
    resets: tuple[RunnerReset, ...]
    #: Where the runner reads the ids; a runner that passes none serves the defaults whatever ``ids`` say.
    source: IdSource
    #: False: the server runs with --enforce-disable-flashinfer-allreduce-fusion.
    allreduce_fusion: bool = True

    @property
    def served_ids(self) -> tuple[int, ...] | None:
        """The ids the setter really gets: None (the default call) where the runner passes none."""
        return None if self.source.kind is IdSourceKind.NONE else self.ids


@dataclass(frozen=True)
class HarnessRuns:
    """What the CPU harness showed for an :class:`IdsReading`; all None: nothing ran (no torch, or static only)."""

    #: These ids on the install as it is (None: the static reading stands).
    ids: "RunOutcome | None" = None
    #: The default call, run only when the runner resets the ids before graph capture.
    default: "RunOutcome | None" = None
    #: These ids after ``patchcraft apply``, run only for -1 on an install apply would patch.
    after_apply: "RunOutcome | None" = None
    #: Why nothing ran though torch is there (the outcome's ``not_run``): the static reading stands, labelled.
    not_run: str = ""


#: No run: the explanation is the static reading's.
NOT_RUN = HarnessRuns()


def read_ids(
    model: Model, layer_ids: Sequence[int] | None, num_layers: int, tp: int = 1, allreduce_fusion: bool = True
) -> IdsReading:
    """The static reading of ``layer_ids`` (None: the default call) on ``model``, served at tensor parallelism ``tp``
    (``allreduce_fusion`` False: with --enforce-disable-flashinfer-allreduce-fusion)."""
    if tp < 1:
        raise PatchcraftError(f"--tp must be positive, not {tp}")
    if num_layers < 1:
        raise PatchcraftError(f"--num-layers must be positive, not {num_layers}")
    ids = tuple(layer_ids) if layer_ids is not None else None
    source = model.id_source()
    served = serve(model, None if source.kind is IdSourceKind.NONE else ids, num_layers)
    default = serve(model, None, num_layers)
    return IdsReading(model, ids, num_layers, tp, served, default, runner_resets(model.tree), source, allreduce_fusion)


def run_harness(reading: IdsReading) -> HarnessRuns:
    """Run what the explanation needs on the CPU harness (:func:`patchcraft.analysis.target_model.run_served`).

    Without torch, or where the harness cannot follow the model, nothing
    more runs and the static reading stays (and says so).
    """
    model, ids, num_layers = reading.model, reading.served_ids, reading.num_layers
    outcome = run_served(model, ids, num_layers)
    if outcome is None:
        return NOT_RUN
    if not outcome.ran:
        return HarnessRuns(not_run=outcome.not_run)
    default = run_served(model, None, num_layers) if reading.resets else None
    after = run_served(model, ids, num_layers, after_apply=True) if _asks_after_apply(model, ids) else None
    return HarnessRuns(outcome, default, after)


def _asks_after_apply(model: Model, ids: tuple[int, ...] | None) -> bool:
    """-1 on an install not patched for it, which ``patchcraft apply`` would patch: say what apply would serve."""
    return ids is not None and -1 in ids and not model.patched and apply_helps(model)


def explanation(reading: IdsReading, runs: HarnessRuns = NOT_RUN) -> Explanation:
    """The explanation of ``reading``, with what the harness showed (``runs``); it runs nothing on the harness.

    With a run, the served states are those the real setter and forward fed
    on the CPU harness; without one, the static reading's, which says
    "unknown" where its rules cannot tell.
    """
    model, ids, num_layers = reading.model, reading.ids, reading.num_layers
    static, outcome = reading.served, runs.ids
    run = static.run
    default_run = runs.default
    default_states = (
        default_run.states
        if default_run is not None and default_run.ran and not default_run.crash
        else reading.default.states
    )
    served = outcome.states if outcome is not None else static.states
    variant, test = setter_variant(run)
    # What apply would serve, read by rules, where nothing ran (the patched setter, in memory).
    after_static = (
        serve(model, ids, num_layers, after_apply=True) if outcome is None and _asks_after_apply(model, ids) else None
    )
    facts = Facts(
        model=model,
        ids=ids,
        run=run,
        rows=id_rows(ids, run, static.reachable, outcome),
        served=static,
        default=reading.default,
        variant=variant,
        test=test,
        rule=rule_text(conversion_rule(ids, run, ""), test, ids, num_layers),
        resets=reading.resets,
        num_layers=num_layers,
        outcome=outcome,
        states=served,
        default_states=default_states,
        after_run=runs.after_apply,
        after_static=after_static,
        not_run=runs.not_run,
        source=reading.source,
    )
    warnings, notes = judge(facts)
    if any(w.kind is FindingKind.STARTUP for w in warnings) and not run.takes_ids:
        served = ()  # the runner's call raises before anything is captured
    cost = None
    if reading.tp > 1:
        cost = fusion_cost(model, served, num_layers, reading.allreduce_fusion)
        warnings += _fusion_findings(model, reading)
    calls = tuple(str(c) for c in run.calls)
    return Explanation(
        version=model.tree.version,
        package=str(model.tree.package),
        model=model.label,
        setter=calls[-1] if calls else model.label,
        calls=calls,
        variant=variant,
        rule=facts.rule,
        patched=model.patched,
        patch_detail=model.patch_detail,
        num_layers=num_layers,
        layer_ids=ids,
        layers_to_capture=run.layers_to_capture,
        embedding=run.embedding,
        rows=facts.rows,
        served=served,
        default_served=default_states,
        resets=reading.resets,
        warnings=tuple(warnings),
        notes=tuple(notes),
        source=RUN if outcome is not None else STATIC,
        outcome=outcome,
        static_served=static.states,
        static_unknown=static.unknown,
        not_run=runs.not_run,
        id_source=reading.source,
        fusion_cost=cost,
        allreduce_fusion=reading.allreduce_fusion,
    )


def _fusion_findings(model: Model, reading: IdsReading) -> list[Finding]:
    """At TP > 1: the partial-sum warning, unless the server turns the fusion off (and the release has that flag)."""
    from patchcraft.reading.server_args import NO_FUSION_FLAG, release_flags

    if reading.allreduce_fusion:
        partial = fusion_defect(model)
        return [Finding(FindingKind.FUSION, partial)] if partial else []
    try:
        flags = release_flags(model.tree.package)
    except PatchcraftError:
        flags = None
    if flags is not None and NO_FUSION_FLAG not in flags.options:
        return [
            Finding(
                FindingKind.FUSION,
                f"SGLang will refuse to start: {model.tree.noun} has no {NO_FUSION_FLAG} flag (it exists from 0.5.10)",
            )
        ]
    return []


def rule_text(rule: str, test: str, ids: tuple[int, ...] | None, num_layers: int) -> str:
    """``ids kept raw (the setter's test `...` is false for these ids)``: the heuristic said with its value, never
    quoted as if it held."""
    if not test or ids is None or not (rule.startswith("+1 rule") or rule.startswith("ids kept raw")):
        return rule
    return f"{rule} ({heuristic_words(test, ids, num_layers)})"


def explain(
    model: Model,
    layer_ids: Sequence[int] | None,
    num_layers: int,
    tp: int = 1,
    run_code: bool = True,
    allreduce_fusion: bool = True,
) -> Explanation:
    """Explain what ``layer_ids`` capture on ``model``'s install (served at tensor parallelism ``tp``;
    ``allreduce_fusion`` False: the server runs with --enforce-disable-flashinfer-allreduce-fusion).

    :func:`read_ids`, then :func:`run_harness` (unless ``run_code`` is False:
    the static reading only), then :func:`explanation`.
    """
    reading = read_ids(model, layer_ids, num_layers, tp, allreduce_fusion)
    return explanation(reading, run_harness(reading) if run_code else NOT_RUN)


@dataclass(frozen=True)
class Suggestion:
    """Config ids that feed a draft its training states (check-draft's suggestion), and whether apply comes first."""

    ids: tuple[int, ...]
    after_apply: bool
