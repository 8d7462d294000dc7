"""``explain --engine vllm``: what a vLLM release feeds an EAGLE-3 draft for a list of ids, by running its code.

Everything is the release's own: where its runners take the ids from
(:mod:`patchcraft.reading.vllm_runner`, run on stand-ins), which runner
is the default, its model-type gate, the model's default getter, setter and
forward (:mod:`patchcraft.harness.vllm_served`, on the CPU harness). vLLM's
id X means ``hs[X]``; the findings say where a release does otherwise:
an id that crashes (with the file and line), one that is dropped, ids that
collapse into one state, an entry that aliases the embedding and is
overwritten in place, ids the default runner does not read from where the
draft keeps them, and a target the gate refuses. The text and the JSON are
:mod:`patchcraft.ui.vllm_explain_text`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from patchcraft.analysis.vllm_findings import (
    HARNESS_ALIAS,
    INTACT,
    NOTES,
    Finding,
    FindingKind,
    alias_words,
    norm_findings,
)
from patchcraft.base.vllm_tree import VllmTree
from patchcraft.reading.vllm_norm_dispatch import NormSetting, read_norm_dispatch, setting_for
from patchcraft.reading.vllm_runner import PLACES, TOP_LEVEL, Gate, RunnerIds, read_gate, read_runners

if TYPE_CHECKING:  # torch-free at import: the harness loads only when a run happens
    from patchcraft.harness.outcomes import RunOutcome

#: ``model_type`` of the architectures whose class name does not give it by the rule in :func:`model_type_of`.
MODEL_TYPES = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "KimiK25ForConditionalGeneration": "kimi_k25",
    "MiniCPMForCausalLM": "minicpm",
    "GptOssForCausalLM": "gpt_oss",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "LlamaForCausalLM": "llama",
}


#: ``fed`` of a class the release serves no EAGLE-3 draft for.
NO_TARGET = "no EAGLE-3 draft (not an EAGLE-3 target on this release)"


def model_type_of(cls: str) -> str:
    """The Hugging Face ``model_type`` of architecture ``cls``: :data:`MODEL_TYPES`, else its name in snake case."""
    if cls in MODEL_TYPES:
        return MODEL_TYPES[cls]
    stem = re.sub(r"For(CausalLM|ConditionalGeneration)$", "", cls)
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", stem).lower()


@dataclass(frozen=True)
class IdAlone:
    """One id set by itself: what the draft gets from it (``fed`` is harness.served.fed_text's wording)."""

    layer_id: int
    fed: str
    states: tuple[int, ...]
    copies: bool
    crash: str
    #: Why the harness could not run it ("" when it ran).
    not_run: str = ""


@dataclass(frozen=True)
class VllmExplanation:
    version: str
    package: str
    model: str
    model_type: str
    num_layers: int
    layer_ids: Optional[tuple[int, ...]]
    gate: Gate
    runners: tuple[RunnerIds, ...]
    #: The model's defaults (from the getter the default runner calls), or () when it could not run.
    defaults: tuple[int, ...]
    #: The ids the default runner sets when the draft keeps ``layer_ids`` at top level (its defaults when it reads none).
    served_ids: tuple[int, ...]
    fed: str  # what the draft gets from ``served_ids``
    fed_states: tuple[int, ...]
    alone: tuple[IdAlone, ...]
    findings: tuple[Finding, ...]
    ran: bool  # False: torch is missing, nothing ran (the runners and the gate are still read)
    #: Facts that change nothing for these ids where the draft keeps them (top level): e.g. a place no runner reads.
    notes: tuple[Finding, ...] = ()
    #: The multimodal wrapper whose setter hands the ids to ``model`` (``kimi_k25.py:394 KimiK25ForConditionalGeneration``).
    via: str = ""
    #: The platform and compilation judged (None: every one), and each setting's add-norm as read from the release.
    platform: Optional[str] = None
    compilation: Optional[str] = None
    norms: tuple[NormSetting, ...] = ()
    #: Entries that are the embedding tensor itself: (position, the state the harness's in-place add-norm left there).
    aliases: tuple[tuple[int, str], ...] = ()
    #: A ``vllm/models/<family>/`` row's class judged without ``--platform``: the platforms that serve it (only
    #: their settings are judged); () when every platform may run the class.
    served_on: tuple[str, ...] = ()


def default_runner(runners: Sequence[RunnerIds]) -> Optional[RunnerIds]:
    return next((r for r in runners if r.default), runners[0] if runners else None)


def explain_vllm(
    tree: VllmTree,
    model_name: str,
    layer_ids: Optional[Sequence[int]],
    num_layers: int,
    tp: int = 1,
    platform: Optional[str] = None,
    compilation: Optional[str] = None,
    per_platform: bool = False,
) -> VllmExplanation:
    """Read the runners and the gate, then run the model's getter, setter and forward (torch needed for the run).

    The run is one rank: at ``tp`` > 1 the reduction reading (:func:`tp_finding`) says whether the captures
    read reduced states (a note) or per-rank partial sums (a warning). ``platform`` (cpu, cuda, rocm, xpu)
    and ``compilation`` (eager, compiled) narrow what is judged where the platform decides (the add-norm
    that may overwrite an embedding entry, the runner a platform without Triton uses); None judges every one.
    ``per_platform`` (explain's own report): an architecture each platform serves from its own module, with no
    ``platform``, is run on each and said per platform (a draft's check needs one platform's states: not there).
    """
    if platform is None and per_platform:
        platforms = family_platforms(tree, model_name)
        if platforms:  # each platform runs its own module: one answer per platform
            return _per_platform(tree, model_name, layer_ids, num_layers, tp, compilation, platforms)
    record = _explain(tree, model_name, layer_ids, num_layers, tp, platform)
    norms = read_norm_dispatch(tree.package)
    served_on = _row_platforms(tree, model_name) if platform is None else ()
    if served_on:  # a family module's class: the platforms that never run it are not judged
        norms = tuple(n for n in norms if n.platform in served_on)
    judged = setting_for(norms, platform, compilation)
    findings, notes = norm_findings(record.findings, judged)
    alias = next((f.text.partition(" | ")[2].split(" ")[0] for f in record.findings if f.kind is FindingKind.ALIAS), "")
    words = alias_words(judged, alias)
    return replace(
        record,
        fed=record.fed.replace(HARNESS_ALIAS, words),
        alone=tuple(replace(a, fed=a.fed.replace(HARNESS_ALIAS, words)) for a in record.alone),
        findings=findings,
        notes=record.notes + notes,
        platform=platform,
        compilation=compilation,
        norms=norms,
        served_on=served_on,
    )


def _row_platforms(tree: VllmTree, model_name: str) -> tuple[str, ...]:
    """The platforms that serve a ``vllm/models/<family>/`` row's class (``deepseek_v32.nvidia.DeepseekV32ForCausalLM``:
    cuda), in the plan's order; () for any other name (a class of ``model_executor/models`` any platform may run)."""
    if model_name.count(".") < 2:
        return ()
    from patchcraft.planning.vllm_plans import plan_vllm

    return next((p.platforms for p in plan_vllm(tree) if p.label == model_name and p.platforms), ())


def family_platforms(tree: VllmTree, model_name: str) -> tuple[str, ...]:
    """The platforms that serve architecture ``model_name`` from ``vllm/models/<family>/`` when no one class of
    ``model_executor/models`` serves it on all of them (0.33's ``KimiK3ForConditionalGeneration``); else ()."""
    from patchcraft.planning.vllm_plans import served_outside
    from patchcraft.reading.vllm_families import read_tables, served

    if "." in model_name:
        return ()
    tables = read_tables(tree.package)
    if not served_outside(tables, model_name):
        return ()
    module, cls = tables[model_name]
    found = served(tree.package, model_name, module, cls)
    if len({(s.stem, s.cls) for s in found if s.in_models}) == 1:
        return ()  # the class a family falls back to answers (the harness runs it as those platforms serve it)
    return tuple(s.platform for s in found if not s.refused)


def _per_platform(
    tree: VllmTree,
    model_name: str,
    layer_ids: Optional[Sequence[int]],
    num_layers: int,
    tp: int,
    compilation: Optional[str],
    platforms: Sequence[str],
) -> VllmExplanation:
    """An architecture each platform serves from its own module: each platform's answer, run, said by platform
    (``cuda: hs[0] ..., hs[2]; rocm: not run: ...``); findings the platforms share said once, naming them."""
    each = [(p, explain_vllm(tree, model_name, layer_ids, num_layers, tp, p, compilation)) for p in platforms]

    def grouped(findings: Callable[[VllmExplanation], Sequence[Finding]]) -> tuple[Finding, ...]:
        found: dict[tuple[FindingKind, str], list[str]] = {}
        for platform, record in each:
            for finding in findings(record):
                found.setdefault((finding.kind, finding.text), []).append(platform)
        return tuple(Finding(kind, f"{', '.join(on)}: {text}") for (kind, text), on in found.items())

    first = each[0][1]
    return replace(
        first,
        model=model_name,
        model_type=_model_type(model_name, model_name),
        via="",
        fed="; ".join(f"{platform}: {record.fed}" for platform, record in each),
        fed_states=(),
        alone=(),
        findings=grouped(lambda r: r.findings),
        notes=grouped(lambda r: r.notes),
        platform=None,
        aliases=(),
        ran=any(record.ran for _, record in each),
    )


def _explain(
    tree: VllmTree,
    model_name: str,
    layer_ids: Optional[Sequence[int]],
    num_layers: int,
    tp: int,
    platform: Optional[str],
) -> VllmExplanation:
    import importlib.util

    runners = read_runners(tree.package, layer_ids, platform=platform)
    gate = read_gate(tree.package)
    runner = default_runner(runners)
    ids = tuple(layer_ids) if layer_ids is not None else None
    set_ids = runner.ids_for(TOP_LEVEL) if runner is not None and ids is not None else None
    findings: list[Finding] = []
    if tp > 1:
        findings.append(tp_finding(tree, model_name, tp))
    findings += _outside_platform(tree)
    if importlib.util.find_spec("torch") is None:
        label = model_name
        findings.append(Finding(FindingKind.NOT_RUN, "torch is not installed: the model's code was not run"))
        return _record(
            tree,
            label,
            num_layers,
            ids,
            gate,
            runners,
            (),
            set_ids or (),
            "not run",
            (),
            (),
            findings,
            False,
            model_name,
        )
    from patchcraft.harness.outcomes import fed_text
    from patchcraft.harness.vllm_runs import class_runs

    getter = (
        runner.default_getter if runner is not None and runner.default_getter else "get_eagle3_aux_hidden_state_layers"
    )
    ran = class_runs(tree.package, model_name, platform, num_layers, set_ids, getter)  # kept by the bytes it ran
    if ran.error:
        findings += _gate_findings(gate, _model_type(model_name, model_name))
        findings.append(Finding(FindingKind.NOT_RUN, ran.error))
        no_target = NO_TARGET.replace("this release", f"{platform} on this release") if platform else NO_TARGET
        fed = no_target if ran.not_a_target else f"not run: {ran.error}"
        return _record(
            tree, model_name, num_layers, ids, gate, runners, (), (), fed, (), (), findings, True, model_name
        )
    defaults, served, outcome = ran.defaults, ran.served, ran.outcome
    if ran.why:
        findings.append(Finding(FindingKind.NOT_RUN, f"the defaults could not be read: {ran.why}"))
    if ran.assumed:
        findings.append(Finding(FindingKind.ASSUMED, ran.assumed))
    alone = tuple(_alone(run, i, fed_text) for i, run in ran.alone)
    holds = dict(ran.holds)
    aliases = tuple(sorted(holds.items()))
    findings += _findings(
        gate,
        _model_type(model_name, ran.outer_name),
        runners,
        runner,
        ids,
        served,
        defaults,
        outcome,
        alone,
        holds,
    )
    return _record(
        tree,
        ran.label,
        num_layers,
        ids,
        gate,
        runners,
        defaults,
        served,
        fed_text(outcome),
        outcome.states if not outcome.crash else (),
        alone,
        findings,
        True,
        model_name,
        ran.via,
        aliases,
    )


def _outside_platform(tree: VllmTree) -> list[Finding]:
    """A build serving a platform from outside the tree (vllm-tpu): what is judged is the tree's, not that platform."""
    from patchcraft.base.vllm_tree import outside_platform

    found = outside_platform(tree.package)
    if found is None:
        return []
    build, platform, serving = found
    text = (
        f"this build ({build}) serves {platform.upper()} through {serving} (platforms/{platform}.py), a package "
        f"outside this tree whose platform and model runner patchcraft does not read: what a {platform.upper()} "
        "server feeds the draft is not judged here; the platforms judged are the tree's own (cuda, rocm, xpu, cpu)"
    )
    return [Finding(FindingKind.PLATFORM, text)]


def tp_finding(tree: VllmTree, model_name: str, tp: int) -> Finding:
    """At TP > 1: what :mod:`patchcraft.reading.vllm_fusion_reading` found for this target's captures."""
    from patchcraft.reading.vllm_fusion_reading import PARTIAL, REDUCED, read_model

    reading = read_model(tree.package, model_name)
    if reading is None:
        return Finding(FindingKind.TP, f"TP {tp}: the reduction is not read ({model_name} is no EAGLE-3 target here)")
    if reading.verdict == PARTIAL:
        return Finding(
            FindingKind.PARTIAL,
            f"TP {tp}: layer states are per-rank partial sums at TP > 1 (all-reduce fusion): {reading.evidence}; "
            "no vLLM server flag forces that reduction (the layer's code defers it, not a compilation pass), "
            "and patchcraft has no fix for it yet",
        )
    if reading.verdict == REDUCED:
        return Finding(FindingKind.TP, f"TP {tp}: every captured state is reduced: {reading.evidence}")
    return Finding(FindingKind.TP, f"TP {tp}: the reduction is not read: {reading.evidence}")


def _model_type(asked: str, cls: str) -> str:
    """The architecture the user named (a config's ``architectures``) gives the gate its model_type; a stem, the class."""
    name = asked.rpartition(".")[2]
    return model_type_of(name if name[:1].isupper() else cls)


def _record(
    tree: VllmTree,
    label: str,
    num_layers: int,
    ids: Optional[tuple[int, ...]],
    gate: Gate,
    runners: Sequence[RunnerIds],
    defaults: Sequence[int],
    served: Sequence[int],
    fed: str,
    states: Sequence[int],
    alone: Sequence[IdAlone],
    findings: Sequence[Finding],
    ran: bool,
    asked: str = "",
    via: str = "",
    aliases: tuple[tuple[int, str], ...] = (),
) -> VllmExplanation:
    notes = tuple(f for f in findings if f.kind in NOTES)
    return VllmExplanation(
        version=tree.version,
        package=str(tree.package),
        model=label,
        model_type=_model_type(asked or label, label.rpartition(".")[2]),
        num_layers=num_layers,
        layer_ids=ids,
        gate=gate,
        runners=tuple(runners),
        defaults=tuple(defaults),
        served_ids=tuple(served),
        fed=fed,
        fed_states=tuple(states),
        alone=tuple(alone),
        findings=tuple(f for f in findings if f.kind not in NOTES),
        ran=ran,
        notes=notes,
        via=via,
        aliases=aliases,
    )


def _alone(outcome: "RunOutcome", layer_id: int, fed_text: Callable[["RunOutcome"], str]) -> IdAlone:
    states = outcome.states if not outcome.crash else ()
    return IdAlone(layer_id, fed_text(outcome), states, outcome.all_copies, outcome.crash, outcome.not_run)


def _findings(
    gate: Gate,
    model_type: str,
    runners: Sequence[RunnerIds],
    runner: Optional[RunnerIds],
    ids: Optional[tuple[int, ...]],
    served: tuple[int, ...],
    defaults: tuple[int, ...],
    outcome: "RunOutcome",
    alone: Sequence[IdAlone],
    holds: dict[int, str],
) -> list[Finding]:
    found = _gate_findings(gate, model_type)
    if ids is not None:
        found += _placement(runners, runner, ids, defaults)
    for entry in alone:
        if entry.not_run:
            continue  # said once, for the whole run, below
        if entry.crash:
            found.append(Finding(FindingKind.CRASH, f"id {entry.layer_id} crashes the forward: {entry.crash}"))
        elif not entry.states and entry.layer_id >= 0:
            found.append(
                Finding(
                    FindingKind.DROPPED,
                    f"id {entry.layer_id} captures nothing (dropped: the forward never captures it)",
                )
            )
        elif not entry.states:
            found.append(Finding(FindingKind.NOTHING, f"id {entry.layer_id} is accepted and captures nothing"))
    repeated = sorted({i for i in served if served.count(i) > 1})
    if repeated:
        said = ", ".join(str(i) for i in repeated)
        found.append(
            Finding(
                FindingKind.COLLAPSED,
                f"repeated id{'s' if len(repeated) > 1 else ''} {said}: each gives one state however often it is listed",
            )
        )
    for position, held in sorted(holds.items()):
        why = "" if held == INTACT else " (layer 0 takes it as its residual)"
        found.append(
            Finding(
                FindingKind.ALIAS,
                f"entry {position} is the embedding output itself, not a copy{why} | {held} instead of hs[0]",
            )
        )
    if not outcome.crash and not outcome.not_run and len(outcome.fed) != len(served):
        found.append(
            Finding(
                FindingKind.COUNT,
                f"the draft gets {len(outcome.fed)} state{'s' if len(outcome.fed) != 1 else ''} for {len(served)} ids "
                f"(an EAGLE-3 draft's fc expects one per id it was trained on)",
            )
        )
    if outcome.not_run:
        found.append(Finding(FindingKind.NOT_RUN, outcome.not_run))
    return found


def _gate_findings(gate: Gate, model_type: str) -> list[Finding]:
    if gate.admits(model_type):
        return []
    return [
        Finding(
            FindingKind.GATE,
            f"SpeculativeConfig refuses EAGLE-3 for model_type {model_type!r} ({gate.where}: one of "
            f"{list(gate.names or ())} must be in it): the server does not start with this target",
        )
    ]


def _placement(
    runners: Sequence[RunnerIds], runner: Optional[RunnerIds], ids: tuple[int, ...], defaults: tuple[int, ...]
) -> list[Finding]:
    """Which runners never read the draft's ids, and which places of the draft's config they do not read."""
    found = []
    served = f"the defaults {list(defaults)} are served" if defaults else "the defaults are served"
    for each in runners:
        role = "the default" if each is runner else "not the default"
        if not each.function:
            found.append(
                Finding(
                    FindingKind.IGNORED,
                    f"the {each.name} ({role}) never reads ids from the draft: {served} ({each.default_getter})",
                )
            )
        elif each.error:
            found.append(Finding(FindingKind.NOT_RUN, f"{each.name}: {each.function} could not run: {each.error}"))
    reading = [r for r in runners if r.function and not r.error]
    blind_places: dict[tuple[str, ...], list[str]] = {}
    for place in PLACES:
        blind = tuple(r.name for r in reading if r.ids_for(place) is None)
        if blind:
            blind_places.setdefault(blind, []).append(place)
    for blind, places in blind_places.items():
        who = (
            "no runner reads"
            if len(blind) == len(runners)
            else " and ".join(f"the {n}" for n in blind) + " does not read"
        )
        where = ", ".join(r.function for r in reading if r.name in blind)
        kind = FindingKind.IGNORED if TOP_LEVEL in places else FindingKind.PLACE
        found.append(
            Finding(kind, f"{who} {' or '.join(places)} ({where}): ids kept only there are ignored and {served}")
        )
    return found
