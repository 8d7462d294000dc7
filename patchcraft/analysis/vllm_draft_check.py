"""Check an EAGLE-3 draft against the vLLM tree that will serve it, and prove every vLLM fix by running it.

The vLLM half of ``check-draft --engine sglang,vllm`` (docs/check-draft.md,
"Both engines"). Everything is the release's own, as ``explain --engine
vllm`` reads it (:mod:`patchcraft.analysis.vllm_explain`): which ids the
default runner takes from the draft's whole ``config.json`` (its id function
run on it, :func:`patchcraft.reading.vllm_runner.read_runners`), the
model-type gate, and the model's setter and forward on the CPU harness.
The checks: ``ids``, ``gate``, ``hidden-size``, ``run``, ``fc-width``,
``range`` and ``convention`` (and, above TP 1, ``tp``: the reduction reading of
:mod:`patchcraft.reading.vllm_fusion_reading`).

A fix is an id list for the **top-level** ``eagle_aux_hidden_state_layer_ids``
(the key every vLLM runner that reads ids reads first; SGLang never reads
it), on the tree as it is or after ``patchcraft apply --engine vllm`` (the
embedding capture vLLM's DeepSeek family lacks). Before a fix is offered the
ids are set in a copy of the draft config and the whole check runs again,
the runner's id function included; one that names apply runs on a private
patched copy of the tree (:mod:`patchcraft.analysis.vllm_applied`).
Candidates: the ids the runner reads now, then each wanted state ``hs[e]``
as ``e`` (vLLM's reading) or ``e - 1`` (SGLang's, ``-1`` for the
embedding); the first list that passes ends the search, so the patch is
tried only when no list passes on the tree as it is.

:func:`one_config` writes both engines' ids into one config and runs both
checks on it again.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from patchcraft.analysis.draft_check import Check, DraftReport, check_hidden
from patchcraft.analysis.fixes import Blocked
from patchcraft.analysis.target_model import Model, states_text
from patchcraft.analysis.training import Expected, Training, expected_states
from patchcraft.analysis.vllm_applied import applied_vllm_tree
from patchcraft.analysis.vllm_explain import FindingKind, VllmExplanation, default_runner, explain_vllm
from patchcraft.base.vllm_tree import VllmTree
from patchcraft.reading.draft_config import DraftConfig, TargetConfig
from patchcraft.reading.vllm_runner import DRAFT_CONFIG, EAGLE_CONFIG, EAGLE_CONFIG_LAYER_IDS, TOP_LEVEL, read_runners

#: Where a vLLM fix puts its ids.
FIELD = "top-level eagle_aux_hidden_state_layer_ids"
MAX_STATES = 8


@dataclass(frozen=True)
class VllmFix:
    """Ids for the top level, on the tree as it is or after ``patchcraft apply --engine vllm --model MODEL``."""

    ids: tuple[int, ...]
    after_apply: bool
    #: ``--model`` of the apply it needs (the model file's stem, ``deepseek_v2``).
    apply_model: str
    #: What the draft is fed with it, as the re-check's run said.
    fed: str
    #: ``hf:I,J,K`` to pass as --trained-on from then on ("" when the convention does not read these ids).
    trained_on: str = ""


@dataclass(frozen=True)
class VllmDraftReport:
    draft: DraftConfig
    target: TargetConfig | None
    explanation: VllmExplanation
    #: The ids vLLM's default runner takes from this config (None: it serves the defaults), and from where.
    ids: tuple[int, ...] | None
    read_from: str
    expected: Expected | None
    checks: tuple[Check, ...]
    verdict: str
    fixes: tuple[VllmFix, ...] = ()
    #: Each way with no passing fix and what fails with it, even when the other way has one (unpatched id 0).
    blocked: tuple[Blocked, ...] = ()
    #: Why no fix was tried with `patchcraft apply --engine vllm` ("" when it was).
    apply_note: str = ""

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks)


# -- the check ------------------------------------------------------------------


def check_vllm_draft(
    tree: VllmTree,
    model_name: str,
    draft: DraftConfig,
    target: TargetConfig | None,
    training: Training | None,
    num_layers: int,
    tp: int = 1,
    setter_modules: Sequence[str] | None = None,
    platform: str | None = None,
    compilation: str | None = None,
) -> VllmDraftReport:
    """What ``tree`` feeds ``draft`` against what it was trained on; every fix proven by the whole check again.

    ``setter_modules``: SGLang's setter files for this model, so that a convention that depends on them
    (SpecForge) reads the same training states as SGLang's check; None: this model's vLLM files. An architecture
    each platform serves from its own ``vllm/models/<family>/`` module (Kimi-K3), with no ``platform`` named, is
    checked on every platform that serves it (:func:`_on_every_platform`).
    """
    if platform is None:
        from patchcraft.analysis.vllm_explain import family_platforms

        platforms = family_platforms(tree, model_name)
        if platforms:
            return _on_every_platform(
                [
                    (
                        p,
                        check_vllm_draft(
                            tree, model_name, draft, target, training, num_layers, tp, setter_modules, p, compilation
                        ),
                    )
                    for p in platforms
                ]
            )
    if setter_modules is not None:
        stems = tuple(setter_modules)
    else:
        stems = _stems(
            _report(tree, model_name, draft, target, None, num_layers, tp, platform, compilation).explanation
        )
    hidden = _hidden(draft, target)
    fc_states = draft.fc_in // hidden if draft.fc_in and hidden and draft.fc_in % hidden == 0 else None
    expected = expected_states(training, draft, fc_states, num_layers, stems, draft.is_speculators)
    report = _report(tree, model_name, draft, target, expected, num_layers, tp, platform, compilation)
    if report.ok or expected is None or expected.problem:
        return report

    def pin(ids: tuple[int, ...]) -> str:
        moved = expected_states(
            training, with_top_level(draft, ids), fc_states, num_layers, stems, draft.is_speculators
        )
        if moved is not None and moved.states == expected.states and not moved.problem:
            return ""
        return "hf:" + ",".join(map(str, expected.states))

    def recheck(state: VllmTree, ids: tuple[int, ...]) -> VllmDraftReport:
        return _report(
            state, model_name, with_top_level(draft, ids), target, expected, num_layers, tp, platform, compilation
        )

    fixes, blocked, note = _prove(tree, report, expected.states, recheck, pin)
    return replace(report, fixes=fixes, blocked=blocked, apply_note=note)


def _on_every_platform(reports: list[tuple[str, VllmDraftReport]]) -> VllmDraftReport:
    """One report for every platform's check: the first that fails (its platform named in the verdict, with the
    others that fail), else the first, its verdict said for all of them."""
    failing = [(p, r) for p, r in reports if not r.ok]
    if not failing:
        platform, report = reports[0]
        said = ", ".join(p for p, _ in reports)
        return replace(report, verdict=f"{report.verdict} (on every platform that serves it: {said})")
    platform, report = failing[0]
    also = [p for p, _ in failing[1:]]
    more = f"; also failing on {', '.join(also)}" if also else ""
    passing = [p for p, r in reports if r.ok]
    fine = f"; ok on {', '.join(passing)}" if passing else ""
    return replace(report, verdict=f"on {platform}: {report.verdict}{more}{fine}")


def with_top_level(draft: DraftConfig, ids: tuple[int, ...]) -> DraftConfig:
    """``draft`` with the top-level ``eagle_aux_hidden_state_layer_ids`` set to ``ids``, as a vLLM fix sets them."""
    raw = dict(draft.raw)
    raw["eagle_aux_hidden_state_layer_ids"] = list(ids)
    return replace(
        draft, raw=raw, top_level_ids=tuple(ids), speculators_ids=tuple(ids) if draft.is_speculators else None
    )


def _report(
    tree: VllmTree,
    model_name: str,
    draft: DraftConfig,
    target: TargetConfig | None,
    expected: Expected | None,
    num_layers: int,
    tp: int,
    platform: str | None = None,
    compilation: str | None = None,
) -> VllmDraftReport:
    runners = read_runners(tree.package, None, config=draft.raw, platform=platform)
    runner = default_runner(runners)
    ids = runner.ids_for(DRAFT_CONFIG) if runner is not None and runner.function and not runner.error else None
    explanation = explained_vllm(tree, model_name, ids, num_layers, tp, platform, compilation)
    read_from = _place(draft, ids) if ids is not None else ""
    hidden = _hidden(draft, target)
    checks = [
        _check_ids(draft, explanation, ids, read_from),
        _check_gate(explanation),
        check_hidden(draft, target, "the draft's own"),
        _check_run(explanation),
        _check_fc(draft, explanation, hidden),
        _check_range(explanation),
        _check_convention(expected, explanation),
    ]
    assumed = next((f.text for f in explanation.notes if f.kind is FindingKind.ASSUMED), "")
    if assumed:
        checks.append(_check_assumed(assumed, target))
    if tp > 1:
        partial = next((f.text for f in explanation.findings if f.kind is FindingKind.PARTIAL), "")
        note = next((f.text for f in explanation.notes if f.kind is FindingKind.TP), "")
        reduced = note.startswith(f"TP {tp}: every captured state is reduced")
        checks.append(Check("tp", False if partial else (True if reduced else None), partial or note))
    failed = [c for c in checks if c.ok is False]
    verdict = (
        failed[0].message
        if failed
        else f"ok: vLLM {explanation.version} will feed the draft "
        + (
            "the states it was trained on"
            if expected is not None and not expected.problem
            else "states of the expected shape"
        )
    )
    return VllmDraftReport(draft, target, explanation, ids, read_from, expected, tuple(checks), verdict)


#: Explanations kept per (tree, model, ids, layers, TP): one command proves every fix without running a list twice.
_EXPLAINED: OrderedDict[tuple, VllmExplanation] = OrderedDict()


def explained_vllm(
    tree: VllmTree,
    model_name: str,
    ids: tuple[int, ...] | None,
    num_layers: int,
    tp: int,
    platform: str | None = None,
    compilation: str | None = None,
) -> VllmExplanation:
    key = (tree.package, model_name, ids, num_layers, tp, platform, compilation)
    if key not in _EXPLAINED:
        _EXPLAINED[key] = explain_vllm(tree, model_name, ids, num_layers, tp, platform, compilation)
        while len(_EXPLAINED) > 64:
            _EXPLAINED.popitem(last=False)
    return _EXPLAINED[key]


def _stems(explanation: VllmExplanation) -> tuple[str, ...]:
    """The model files of the vLLM class (the wrapper's first, ``kimi_k25``, then ``deepseek_v2``)."""
    wrapper = explanation.via.split(".py:", 1)[0] if explanation.via else ""
    return tuple(s for s in (wrapper, explanation.model.partition(".")[0]) if s)


def _place(draft: DraftConfig, ids: tuple[int, ...]) -> str:
    """The first place of the config that holds ``ids`` (the runner's own mapping aside: DFlash's +1)."""
    eagle = draft.raw.get("eagle_config") if isinstance(draft.raw.get("eagle_config"), dict) else {}
    held = {
        TOP_LEVEL: draft.raw.get("eagle_aux_hidden_state_layer_ids"),
        EAGLE_CONFIG: (eagle or {}).get("eagle_aux_hidden_state_layer_ids"),
        EAGLE_CONFIG_LAYER_IDS: (eagle or {}).get("layer_ids"),
    }
    return next((place for place, value in held.items() if value == list(ids)), "the draft's config")


def _hidden(draft: DraftConfig, target: TargetConfig | None) -> int | None:
    return (target.hidden_size if target else None) or draft.target_hidden_size or draft.hidden_size


def _check_ids(draft: DraftConfig, explanation: VllmExplanation, ids: tuple[int, ...] | None, read_from: str) -> Check:
    runner = default_runner(explanation.runners)
    defaults = (
        f"vLLM serves its defaults {list(explanation.defaults)}" if explanation.defaults else "vLLM serves its defaults"
    )
    if runner is None:
        return Check("ids", None, f"this tree has no model runner: {defaults}")
    if not runner.function:
        return Check("ids", None, f"the {runner.name} (the default) never reads ids from the draft: {defaults}")
    if runner.error:
        return Check("ids", None, f"the {runner.name}'s {runner.function} could not run: {runner.error}")
    if ids is not None:
        return Check("ids", True, f"vLLM's {runner.name} reads {read_from} {list(ids)} ({runner.function})")
    kept = [
        f"{name} {list(value)}"
        for name, value in (("eagle_config.eagle_aux_hidden_state_layer_ids", draft.layer_ids),)
        if value is not None
    ]
    where = f"; the draft keeps its ids only in {kept[0]}, which this runner never reads" if kept else ""
    return Check(
        "ids",
        None,
        f"the {runner.name} (the default, {runner.function}) reads no ids from this config{where}: {defaults}",
    )


def _check_gate(explanation: VllmExplanation) -> Check:
    gate = explanation.gate
    if gate.names is None:
        return Check("gate", True, "this release has no model-type gate for EAGLE-3 targets")
    if gate.admits(explanation.model_type):
        return Check("gate", True, f"model_type {explanation.model_type!r} is admitted ({gate.where})")
    found = [f for f in explanation.findings if f.kind is FindingKind.GATE]
    return Check("gate", False, found[0].text if found else f"model_type {explanation.model_type!r} is refused")


def _crashed(explanation: VllmExplanation) -> bool:
    return any(f.kind is FindingKind.CRASH for f in explanation.findings) or explanation.fed.startswith("crash")


def _not_run(explanation: VllmExplanation) -> str:
    found = [f.text for f in explanation.findings if f.kind is FindingKind.NOT_RUN]
    if not explanation.ran or explanation.fed.startswith("not run") or explanation.fed.startswith("no EAGLE-3"):
        return found[0] if found else explanation.fed
    return ""


def _check_run(explanation: VllmExplanation) -> Check:
    if _crashed(explanation):
        return Check("run", False, f"vLLM will {explanation.fed} (its first step, on the CPU harness)")
    why = _not_run(explanation)
    if why:
        return Check("run", None, why)
    alias = [f.text for f in explanation.findings if f.kind is FindingKind.ALIAS]
    if alias:
        return Check("run", False, alias[0])
    return Check(
        "run",
        True,
        f"ran vLLM {explanation.version}'s setter and forward on the CPU harness: fed {explanation.fed}",
    )


def _check_assumed(assumed: str, target: TargetConfig | None) -> Check:
    """The run took one side of a config switch (:mod:`patchcraft.harness.switches`: Kimi-K3's attention residuals,
    GLM-5-Next's hyper-connections): the target's config says whether that side is this target's (a pass), the
    other (a failure: what it feeds is not shown), or nothing (unknown)."""
    from patchcraft.harness.switches import named_in

    switch = named_in(assumed)
    if switch is None or target is None:
        return Check("config", None, f"{assumed} (give --target to tell which side the target runs)")
    side = switch.side_of(target.fields)
    if side is None:
        return Check("config", None, f"{target.path} does not set {switch.field}: {assumed}")
    if side:
        return Check("config", True, f"{target.path}: {switch.field} runs the side the harness ran ({switch.side})")
    value = target.fields.get(switch.field)
    return Check(
        "config",
        False,
        f"{target.path} sets {switch.field} = {value!r}: this target runs {switch.other}, which the harness does "
        f"not model (it ran {switch.side}); what vLLM feeds this draft is not shown",
    )


def _check_fc(draft: DraftConfig, explanation: VllmExplanation, hidden: int | None) -> Check:
    if draft.fc_in is None or hidden is None:
        why = draft.fc_source if draft.fc_in is None else "no hidden size known"
        return Check("fc-width", None, f"fc input width not checked ({why})")
    if _crashed(explanation) or _not_run(explanation):
        return Check("fc-width", None, "not checked: nothing was fed (see run)")
    fed = len(explanation.fed_states)
    if draft.fc_in == hidden * fed:
        return Check("fc-width", True, f"fc input width {draft.fc_in} = {fed} x {hidden}")
    return Check(
        "fc-width",
        False,
        f"the draft's fc takes {draft.fc_in} inputs but vLLM will feed {fed} states "
        f"({states_text(explanation.fed_states)}) of width {hidden}, {fed * hidden} in all",
    )


def _check_range(explanation: VllmExplanation) -> Check:
    kinds = (FindingKind.DROPPED, FindingKind.NOTHING, FindingKind.COLLAPSED, FindingKind.COUNT)
    found = [f for f in explanation.findings if f.kind in kinds]
    if found:
        return Check("range", False, found[0].text)
    if _crashed(explanation):
        return Check("range", None, "not checked: the forward crashes before every id is captured (see run)")
    return Check("range", True, f"every id is captured on a {explanation.num_layers}-layer target")


def _check_convention(expected: Expected | None, explanation: VllmExplanation) -> Check:
    if expected is None:
        return Check(
            "convention",
            None,
            "training convention not checked (pass --trained-on hf:I,J,K, specforge, speculators or eagle)",
        )
    if expected.problem:
        return Check("convention", False, expected.problem)
    if _crashed(explanation) or _not_run(explanation):
        return Check(
            "convention",
            None,
            f"not checked: nothing was fed (see run); the draft was trained on {states_text(expected.states)}",
        )
    served, wanted = explanation.fed_states, expected.states
    if served == wanted:
        return Check("convention", True, f"vLLM feeds {states_text(served)}, as trained ({expected.how})")
    return Check(
        "convention",
        False,
        f"vLLM will feed {states_text(served)} but the draft was trained on {states_text(wanted)} ({expected.how})",
    )


# -- the fixes -----------------------------------------------------------------------


def _prove(
    tree: VllmTree,
    report: VllmDraftReport,
    wanted: tuple[int, ...],
    recheck: Callable[[VllmTree, tuple[int, ...]], VllmDraftReport],
    pin: Callable[[tuple[int, ...]], str],
) -> tuple[tuple[VllmFix, ...], tuple[Blocked, ...], str]:
    """The fixes (ids alone first, then with the vLLM patch), each the whole check passing with it applied."""
    if not wanted or list(wanted) != sorted(set(wanted)) or len(wanted) > MAX_STATES:
        return (), (), ""
    label = report.explanation.model
    # The --model the printed command names is the label the proof applied: a file stem can also name a
    # row patchcraft does not patch (0.29+'s deepseek_v2.GlmMoeDsaForCausalLM), which makes apply exit 1.
    stem = label
    ways: list[tuple[bool, VllmTree | None, str]] = [(False, tree, "")]
    applied = applied_vllm_tree(tree, label) if "." in label else None
    note = applied.why if applied is not None else f"{label}: no model class to patch"
    ways.append((True, applied.tree if applied is not None else None, note))
    fixes: list[VllmFix] = []
    blocked: list[Blocked] = []
    for after_apply, state, why in ways:
        if fixes:  # the patch is tried only when no id list passes without it (least invasive first)
            break
        way = f"after `patchcraft apply --engine vllm --model {stem}`" if after_apply else "this vLLM tree as it is"
        if state is None:
            blocked.append(Blocked(way, why))
            continue
        failures, first = 0, Blocked("", "")
        for ids in _candidates(wanted, report.ids):
            result = recheck(state, ids)
            failed = [c for c in result.checks if c.ok is False]
            if not failed:
                fix = VllmFix(ids, after_apply, stem, result.explanation.fed, pin(ids))
                if not any(f.ids == fix.ids for f in fixes):
                    fixes.append(fix)
                break
            if not failures:
                also = f" (also failing: {', '.join(c.name for c in failed[1:])})" if len(failed) > 1 else ""
                first = Blocked(f"{list(ids)} {way}", f"{failed[0].name}: {failed[0].message}{also}")
            failures += 1
        if failures and not any(f.after_apply == after_apply for f in fixes):
            blocked.append(replace(first, others=failures - 1))
    return tuple(fixes), tuple(blocked), (note if applied is None or applied.tree is None else "")


def _candidates(wanted: tuple[int, ...], current: tuple[int, ...] | None) -> Iterator[tuple[int, ...]]:
    """The ids the runner reads now, then vLLM's reading of each state (``hs[e]`` is ``e``), then SGLang's."""
    seen = set()
    choices = [(e, e - 1) if e > 0 else (0, -1) for e in wanted]
    for ids in itertools.chain([current] if current is not None else [], itertools.product(*choices)):
        if ids not in seen:
            seen.add(ids)
            yield tuple(ids)


def fix_text(fix: VllmFix, current: tuple[int, ...] | None, version: str, target: str) -> str:
    """One vLLM fix as the user applies it, with what the re-check showed."""
    verb = "keep" if fix.ids == current else "set"
    text = f"{verb} {FIELD} = {list(fix.ids)}"
    if fix.after_apply:
        text += f" after `patchcraft apply --engine vllm {target} --model {fix.apply_model}`"
    else:
        text += " (this vLLM tree as it is: no patch needed)"
    if fix.trained_on:
        text += (
            f"; from then on check it with --trained-on {fix.trained_on} "
            "(the convention would read other training states from the new ids)"
        )
    return f"{text} [proven by running the code on the CPU harness: vLLM {version} feeds {fix.fed}]"


def apply_target(tree: VllmTree, release: str | None) -> str:
    """How the printed apply names this tree: ``--release X`` for a fetched release, else its path."""
    return f"--release {release}" if release else str(Path(tree.package))


# -- one config for both engines ----------------------------------------------------------------


@dataclass(frozen=True)
class OneConfig:
    """Both engines' ids in one ``config.json``, and both checks run again on it."""

    #: SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids`` (None: none, the defaults) and what it needs.
    sglang_ids: tuple[int, ...] | None
    sglang_after_apply: bool
    sglang_flags: tuple[str, ...]
    #: vLLM's top-level ids (None: none set, the runner's reading as it is) and what they need.
    vllm_ids: tuple[int, ...] | None
    vllm_after_apply: bool
    vllm_model: str
    #: Both checks passed on the combined config.
    ok: bool
    #: The first check that failed on it ("" when ok).
    why: str = ""


def one_config(
    sglang: DraftReport,
    model: Model,
    vllm: VllmDraftReport,
    tree: VllmTree,
    model_name: str,
    training: Training | None,
    num_layers: int,
    cuda_graph: bool = True,
    tp: int = 1,
    allreduce_fusion: bool = True,
) -> OneConfig | None:
    """The config that serves the training states on both engines, proven by both whole checks on it; None
    when an engine has no passing fix."""
    from patchcraft.analysis.applied import applied_model
    from patchcraft.analysis.draft_check import check_draft
    from patchcraft.analysis.fixes import CUDA_GRAPH_FLAG, FUSION_FLAG
    from patchcraft.analysis.training import parse_training
    from patchcraft.reading.draft_config import with_ids

    if not sglang.ok and not sglang.fixes or not vllm.ok and not vllm.fixes:
        return None
    draft = sglang.draft
    s_ids, s_apply, s_flags = draft.layer_ids, False, tuple[str, ...]()
    if not sglang.ok:
        fix = sglang.fixes[0]
        s_ids, s_apply, s_flags = fix.ids, fix.after_apply, fix.flags
    v_ids, v_apply, v_model = (
        (None, False, "") if vllm.ok else (vllm.fixes[0].ids, vllm.fixes[0].after_apply, vllm.fixes[0].apply_model)
    )
    combined = with_ids(draft, s_ids) if s_ids is not None and s_ids != draft.layer_ids else draft
    if v_ids is not None:
        combined = with_top_level(combined, v_ids)
    expected = vllm.expected
    pinned = (
        parse_training("hf:" + ",".join(map(str, expected.states))) if expected and not expected.problem else training
    )
    state = applied_model(model).model if s_apply else model
    if state is None:
        return OneConfig(
            s_ids, s_apply, s_flags, v_ids, v_apply, v_model, False, "sglang: the patched copy cannot be built"
        )
    again = check_draft(
        state,
        combined,
        sglang.target,
        pinned,
        num_layers,
        cuda_graph=cuda_graph and CUDA_GRAPH_FLAG not in s_flags,
        tp=tp,
        allreduce_fusion=allreduce_fusion and FUSION_FLAG not in s_flags,
    )
    v_tree = applied_vllm_tree(tree, vllm.explanation.model).tree if v_apply else tree
    if v_tree is None:
        return OneConfig(
            s_ids, s_apply, s_flags, v_ids, v_apply, v_model, False, "vllm: the patched copy cannot be built"
        )
    judged = vllm.explanation
    v_again = _report(
        v_tree, model_name, combined, vllm.target, expected, num_layers, tp, judged.platform, judged.compilation
    )
    failed = [("sglang", c) for c in again.checks if c.ok is False] + [
        ("vllm", c) for c in v_again.checks if c.ok is False
    ]
    why = f"{failed[0][0]}: {failed[0][1].name}: {failed[0][1].message}" if failed else ""
    return OneConfig(s_ids, s_apply, s_flags, v_ids, v_apply, v_model, not failed, why)
