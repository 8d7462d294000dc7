"""Check an EAGLE-3 draft against the install that will serve it.

A draft is trained on a list of the target's hidden states; SGLang feeds
it the states its setter and forward capture for the draft config's
``eagle_config.eagle_aux_hidden_state_layer_ids``. The two agree only if
the ids follow this install's convention. This module takes the draft's
and the target's configs as :mod:`patchcraft.reading.draft_config` reads
them (``config.json``, and the ``fc.weight`` shape from the safetensors
header, as JSON, without torch) and the training convention, and compares
them through :mod:`patchcraft.analysis.explain`.

The training presets (what ``--trained-on`` means) live in
:mod:`patchcraft.analysis.training`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from patchcraft.reading.draft_config import DraftConfig, TargetConfig, with_ids
from patchcraft.analysis.explain import Explanation, Suggestion, explain
from patchcraft.analysis.explain_findings import FindingKind
from patchcraft.planning.id_source import RELEASE_DEFAULT, IdSource, IdSourceKind
from patchcraft.analysis.target_model import RUN, Model, states_text
from patchcraft.analysis.fixes import (
    FUSION_FLAG,
    Blocked,
    Fix,
    Proven,
    Recheck,
    Serving,
    has_fusion_flag,
    prove,
)
from patchcraft.analysis.training import Expected, Training, expected_states


# -- the check ------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: not checked
    message: str


@dataclass(frozen=True)
class DraftReport:
    draft: DraftConfig
    target: TargetConfig | None
    explanation: Explanation
    hidden_size: int | None
    expected: Expected | None
    checks: tuple[Check, ...]
    verdict: str
    suggestion: Suggestion | None
    suggestion_text: str
    #: Every fix that passes the whole check once applied, least invasive first (:mod:`patchcraft.analysis.fixes`).
    fixes: tuple[Fix, ...] = ()
    #: The ways tried that fail the check, and what fails with each (when no fix passes).
    blocked: tuple[Blocked, ...] = ()
    #: How the training states were read: the convention assumed, and whether they came from the config's own ids.
    training_notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks)


def check_draft(
    model: Model,
    draft: DraftConfig,
    target: TargetConfig | None,
    training: Training | None,
    num_layers: int,
    cuda_graph: bool = True,
    tp: int = 1,
    allreduce_fusion: bool = True,
) -> DraftReport:
    """Compare what this install feeds ``draft`` with what it was trained on (served at TP ``tp``).

    The training states are read once, from the config as given; every fix
    offered was checked again with it applied (:func:`patchcraft.analysis.fixes.prove`)
    against those same states.
    """
    serving = Serving(tp, cuda_graph, allreduce_fusion)
    explanation = explained(model, draft.layer_ids, num_layers, tp, allreduce_fusion)
    hidden = (target.hidden_size if target else None) or draft.target_hidden_size or draft.hidden_size
    fc_states = draft.fc_in // hidden if draft.fc_in and hidden and draft.fc_in % hidden == 0 else None
    modules = setter_modules(explanation)
    expected = expected_states(training, draft, fc_states, num_layers, modules, draft.is_speculators)

    def recheck(state: Model, ids: tuple[int, ...], how: Serving) -> Recheck:
        result = explained(state, ids, num_layers, how.tp, how.allreduce_fusion)
        checks = _checks(state, with_ids(draft, ids), target, hidden, expected, result, how)
        return Recheck(tuple(checks), result.rule, result.source)

    def pin(ids: tuple[int, ...]) -> str:
        """``--trained-on hf:...`` once the config holds ``ids``, when the convention would read other states from them."""
        if expected is None or ids == draft.layer_ids:
            return ""
        moved = expected_states(training, with_ids(draft, ids), fc_states, num_layers, modules, draft.is_speculators)
        if moved is not None and moved.states == expected.states and not moved.problem:
            return ""
        return "hf:" + ",".join(map(str, expected.states))

    checks = _checks(model, draft, target, hidden, expected, explanation, serving)
    failed = [c for c in checks if c.ok is False]
    proven = Proven()
    if failed and (expected is None or not expected.problem):
        proven = prove(model, expected.states if expected else None, draft.layer_ids, num_layers, serving, recheck, pin)
    found = proven.fixes
    suggestion = Suggestion(found[0].ids, found[0].after_apply) if found else None
    reads = _reads_config(training, draft, expected, fc_states, num_layers, modules)
    trained = "the states its config's ids say it was trained on" if reads else "the states it was trained on"
    verdict = (
        failed[0].message
        if failed
        else "ok: SGLang will feed the draft "
        + (trained if expected and not expected.problem else "states of the expected shape")
    )
    return DraftReport(
        draft,
        target,
        explanation,
        hidden,
        expected,
        tuple(checks),
        verdict,
        suggestion,
        _suggestion_text(proven, expected, explanation, draft, bool(failed)),
        found,
        proven.blocked,
        _training_notes(training, draft, expected, reads),
    )


def _checks(
    model: Model,
    draft: DraftConfig,
    target: TargetConfig | None,
    hidden: int | None,
    expected: Expected | None,
    explanation: Explanation,
    serving: Serving,
) -> list[Check]:
    """The whole check of ``draft`` on ``model``'s install, served as ``serving`` says."""
    checks = [
        _check_ids(draft, explanation),
        check_hidden(draft, target),
        _check_run(explanation),
        _check_fc(draft, explanation, hidden),
        _check_range(explanation),
        _check_embedding(draft, explanation, model),
        _check_convention(expected, explanation),
        _check_cuda_graph(explanation, expected, serving.cuda_graph),
    ]
    if serving.tp > 1:
        checks.append(_check_fusion(model, explanation, serving))
    return checks


#: Explanations kept per model object (a few models): one command proves every fix without explaining an id list twice.
_EXPLAINED: OrderedDict[int, tuple[Model, dict[tuple, Explanation]]] = OrderedDict()


def explained(
    model: Model, ids: tuple[int, ...] | None, num_layers: int, tp: int, allreduce_fusion: bool = True
) -> Explanation:
    """:func:`patchcraft.analysis.explain.explain`, once per (model, ids, layers, TP, torch there or not)."""
    import patchcraft.harness

    entry = _EXPLAINED.get(id(model))
    if entry is None or entry[0] is not model:
        entry = (model, {})
        _EXPLAINED[id(model)] = entry
        while len(_EXPLAINED) > 8:
            _EXPLAINED.popitem(last=False)
    _EXPLAINED.move_to_end(id(model))
    # "torch there or not" by the function that tells (a test replaces it to have none), not by importing
    # torch: a check answered from kept harness runs never imports it (harness.run_cache)
    key = (ids, num_layers, tp, allreduce_fusion, patchcraft.harness.torch_problem)
    if key not in entry[1]:
        entry[1][key] = explain(model, ids, num_layers, tp=tp, allreduce_fusion=allreduce_fusion)
    return entry[1][key]


def _training_notes(
    training: Training | None, draft: DraftConfig, expected: Expected | None, reads_config: bool
) -> tuple[str, ...]:
    """Which convention was assumed, and whether the training states came from the config's own ids."""
    if expected is None:
        return ()
    notes = []
    if training is None:
        fmt = "its speculators_config" if draft.is_speculators else "its format"
        notes.append(
            f"no --trained-on given: assumed from the config's format ({fmt} names the pipeline): {expected.how}; "
            "pass --trained-on to say how it was trained"
        )
    if reads_config:
        notes.append(
            "read from the draft config's own ids: a config whose ids are wrong is not caught here; "
            "--trained-on hf:I,J,K checks against the states the draft was trained on"
        )
    return tuple(notes)


def _reads_config(
    training: Training | None,
    draft: DraftConfig,
    expected: Expected | None,
    fc_states: int | None,
    num_layers: int,
    modules: tuple[str, ...],
) -> bool:
    """Whether the training states move with the config's ids (eagle_config's and the top level's)."""
    if expected is None or expected.problem:
        return False
    other = replace(
        with_ids(draft, _shifted(draft.layer_ids)),
        top_level_ids=_shifted(draft.top_level_ids),
        speculators_ids=_shifted(draft.speculators_ids) if draft.is_speculators else None,
    )
    moved = expected_states(training, other, fc_states, num_layers, modules, draft.is_speculators)
    return moved is None or moved.states != expected.states


def _shifted(ids: tuple[int, ...] | None) -> tuple[int, ...]:
    return tuple(i + 1 for i in ids) if ids else (1, 2, 3)


def _check_run(explanation: Explanation) -> Check:
    """The served states by running the code: a crash or nothing captured fails; static says so."""
    found = explanation.findings(FindingKind.CRASH, FindingKind.NOTHING, FindingKind.UNKNOWN) + [
        w for w in explanation.findings(FindingKind.STARTUP) if explanation.source == RUN
    ]
    if found:
        return Check("run", False, found[0].message)
    if explanation.source != RUN:
        return Check("run", None, explanation.static_why)
    if explanation.outcome is not None and not explanation.outcome.all_copies:
        return Check("run", False, explanation.findings(FindingKind.EMBEDDING)[0].message)
    return Check(
        "run", True, f"ran this install's setter and forward on the CPU harness: fed {states_text(explanation.served)}"
    )


def _check_fusion(model: Model, explanation: Explanation, serving: Serving) -> Check:
    if not serving.allreduce_fusion:
        if not has_fusion_flag(model):
            return Check(
                "fusion", False, f"{FUSION_FLAG} does not exist in SGLang {explanation.version}: the server refuses it"
            )
        return Check(
            "fusion", True, f"the server runs with {FUSION_FLAG}: every layer completes its all-reduce before a capture"
        )
    found = explanation.findings(FindingKind.FUSION)
    if found:
        return Check("fusion", False, found[0].message)
    return Check("fusion", True, f"captured layer states are all-reduced at TP {serving.tp}")


def _check_ids(draft: DraftConfig, explanation: Explanation) -> Check:
    source = explanation.id_source or RELEASE_DEFAULT
    if source.kind is IdSourceKind.SERVER_FLAG:
        return Check(
            "ids",
            None,
            f"not checked: this tree's runner reads the ids from {source.text}; the draft config's ids are never "
            "read, so the states below are those the flag serves when it holds the same ids",
        )
    if source.kind is IdSourceKind.NONE:
        return Check("ids", None, f"this tree's runner reads {source.text}: {states_text(explanation.served)}")
    if draft.layer_ids is not None:
        return Check(
            "ids", True, f"SGLang reads {source.field} {list(draft.layer_ids)} ({source.read_at or 'the runner'})"
        )
    where = " (the speculators-format ids are not read by SGLang)" if draft.speculators_ids else ""
    return Check(
        "ids",
        None,
        f"no {source.field}{where}: SGLang captures its default layers {states_text(explanation.served)}",
    )


def check_hidden(
    draft: DraftConfig, target: TargetConfig | None, fallback: str = "SGLang takes the draft's own"
) -> Check:
    """The draft's width for the target's states against the target's ``hidden_size`` (both engines' check).

    Without target_hidden_size (every SpecForge config) the engine's draft code sizes the fc for states of
    the draft's own hidden_size (``fallback`` says so): compare that.
    """
    name, width = ("target_hidden_size", draft.target_hidden_size)
    if width is None:
        name, width = (f"hidden_size (no target_hidden_size: {fallback})", draft.hidden_size)
    if target is None or target.hidden_size is None or width is None:
        return Check(
            "hidden-size",
            None,
            "target hidden size not compared (needs --target, and target_hidden_size or hidden_size)",
        )
    if width == target.hidden_size:
        return Check("hidden-size", True, f"{name} {width} matches the target")
    return Check(
        "hidden-size",
        False,
        f"the draft's {name} is {width} but the target's hidden_size is {target.hidden_size}: "
        "this draft was trained for another target",
    )


def _check_fc(draft: DraftConfig, explanation: Explanation, hidden: int | None) -> Check:
    if draft.fc_in is None or hidden is None:
        why = draft.fc_source if draft.fc_in is None else "no hidden size known"
        return Check("fc-width", None, f"fc input width not checked ({why})")
    fed = len(explanation.served)
    if draft.fc_in == hidden * fed:
        return Check("fc-width", True, f"fc input width {draft.fc_in} = {fed} x {hidden}")
    wanted = (
        f"{draft.fc_in // hidden} states" if draft.fc_in % hidden == 0 else f"a width that is no multiple of {hidden}"
    )
    return Check(
        "fc-width",
        False,
        f"the draft's fc takes {draft.fc_in} inputs ({wanted}) but SGLang will feed {fed} states "
        f"({states_text(explanation.served)}) of width {hidden}, {fed * hidden} in all",
    )


def _check_range(explanation: Explanation) -> Check:
    found = explanation.findings(FindingKind.STARTUP, FindingKind.LEGACY, FindingKind.RANGE)
    if found:
        return Check("range", False, found[0].message)
    if explanation.findings(FindingKind.CRASH):
        return Check("range", None, "not checked: the forward crashes before any id is captured (see run)")
    return Check("range", True, f"every id is captured on a {explanation.num_layers}-layer target")


def _check_embedding(draft: DraftConfig, explanation: Explanation, model: Model) -> Check:
    if not draft.layer_ids or -1 not in draft.layer_ids:
        return Check("embedding", True, "id -1 not used")
    if model.patched:
        return Check("embedding", True, "id -1 on a patched install: hs[0] is captured (cloned) first")
    return Check(
        "embedding", False, f"the draft config asks for id -1 (the embedding) but the install is {model.patch_detail}"
    )


def _check_convention(expected: Expected | None, explanation: Explanation) -> Check:
    if expected is None:
        return Check(
            "convention",
            None,
            "training convention not checked (pass --trained-on hf:I,J,K, specforge, speculators or eagle)",
        )
    if expected.problem:
        return Check("convention", False, expected.problem)
    served, wanted = explanation.served, expected.states
    if served == wanted:
        return Check("convention", True, f"SGLang feeds {states_text(served)}, as trained ({expected.how})")
    if list(wanted) != sorted(set(wanted)):
        return Check(
            "convention",
            False,
            f"the draft was trained on {states_text(wanted)}, but SGLang always feeds states in layer order, once each",
        )
    return Check(
        "convention",
        False,
        f"SGLang will feed {states_text(served)} but the draft was trained on {states_text(wanted)} ({expected.how}): "
        f"the ids in the draft config do not follow this install's convention ({explanation.rule})",
    )


def _check_cuda_graph(explanation: Explanation, expected: Expected | None, cuda_graph: bool) -> Check:
    if not explanation.graph_reset:
        return Check("cuda-graph", True, "the configured ids reach CUDA-graph capture")
    if not cuda_graph:
        return Check(
            "cuda-graph", None, "CUDA graphs disabled (--no-cuda-graph): the reset before graph capture does not apply"
        )
    wanted = expected.states if expected and not expected.problem else explanation.served
    if explanation.default_served == wanted:
        return Check("cuda-graph", True, "the ids are reset before graph capture, but the defaults are the same states")
    found = explanation.findings(FindingKind.CUDA_GRAPH)
    message = (
        found[0].message
        if found
        else (f"CUDA-graph decode will capture the default layers ({states_text(explanation.default_served)})")
    )
    return Check("cuda-graph", False, message)


def _suggestion_text(
    proven: Proven, expected: Expected | None, explanation: Explanation, draft: DraftConfig, failed: bool
) -> str:
    """The fixes, each with what it claims of other releases; or why none is offered."""
    if not failed:
        return ""
    if expected is not None and expected.problem:
        return (
            f"no fix: the training states are not known ({expected.problem}); "
            "pass them with --trained-on hf:I,J,K (Hugging Face hidden_states indices, 0 = embedding)"
        )
    lines = []
    for index, fix in enumerate(proven.fixes):
        lines.append(("" if index == 0 else "  or: ") + fix_text(fix, draft.layer_ids, explanation.id_source))
        lines.append("    " + claim_text(fix, explanation.version))
    if lines:
        return "\n".join(lines)
    if not proven.blocked:
        return ""
    lines = ["no fix passes the whole check once applied; what fails with each way tried:"]
    for b in proven.blocked:
        more = f" ({b.others} more id list{'s' if b.others > 1 else ''} tried this way fail too)" if b.others else ""
        lines.append(f"  {b.way}: {b.why}{more}")
    return "\n".join(lines)


def fix_text(fix: Fix, current: tuple[int, ...] | None, source: IdSource | None = None) -> str:
    """One fix as the user applies it: the ids (where this tree's runner reads them), the patch, the server flags,
    the --trained-on from then on."""
    source = source or RELEASE_DEFAULT
    field_name = source.field if source.from_draft else RELEASE_DEFAULT.field
    if source.kind is IdSourceKind.SERVER_FLAG:
        text = source.setting(fix.ids)
        if fix.after_apply:
            text += " after `patchcraft apply` (or through `patchcraft run`)"
    elif fix.ids == current:
        text = f"keep {field_name} = {list(fix.ids)}"
        if fix.after_apply:
            text += " and run `patchcraft apply` (or serve through `patchcraft run`)"
    else:
        text = f"set {field_name} = {list(fix.ids)}"
        if fix.after_apply:
            text += " after `patchcraft apply` (or serve through `patchcraft run`)"
    if not fix.after_apply and not fix.flags:
        text += " (this install as it is: no patch needed)"
    if fix.flags:
        text += (" and" if fix.after_apply else ", no patch needed, and") + " serve with " + " and ".join(fix.flags)
    if fix.trained_on:
        text += (
            f"; from then on check it with --trained-on {fix.trained_on} "
            "(the convention would read other training states from the new ids)"
        )
    proof = "proven by running the code on the CPU harness" if fix.proof == RUN else "static reading"
    return f"{text} [{proof}]"


def claim_text(fix: Fix, version: str) -> str:
    """What the ids mean on other releases: claimed only where it holds by construction."""
    ids = list(fix.ids)
    if fix.portable:
        return (
            f"{ids} after `patchcraft apply` means the same on every release "
            "(with -1, patchcraft's setter reads every other id as a layer output)"
        )
    rule = f": {fix.rule}" if fix.rule else ""
    return (
        f"{ids} is release-specific: SGLang {version} reads it by its own rule{rule}; "
        "another release may feed other states for the same list"
    )


def convention_known(draft: DraftConfig) -> bool:
    """Whether the training states are known without ``--trained-on`` (a config whose format names its pipeline)."""
    return expected_states(None, draft, None, 1, (), draft.is_speculators) is not None


def setter_modules(explanation: Explanation) -> tuple[str, ...]:
    """The model files whose setters ran (``deepseek_v2`` for ``deepseek_v2.py:2295 ...``), delegation first."""
    return tuple(call.split(".py:", 1)[0] for call in explanation.calls)


def speculators_note(draft: DraftConfig) -> str:
    """One line on the top-level ids (speculators format or not), or "" when there are none to mention."""
    if draft.is_speculators:
        ids = list(draft.speculators_ids) if draft.speculators_ids else "none"
        return f"speculators format: eagle_aux_hidden_state_layer_ids {ids} (id j = hs[j], 0 = embedding)"
    if draft.top_level_ids is None:
        return ""
    return (
        f"top-level eagle_aux_hidden_state_layer_ids {list(draft.top_level_ids)}: SGLang ignores it (it reads "
        "eagle_config's), vLLM reads it before eagle_config's (and reads id j as hs[j])"
    )
