"""What an explanation says about its ids: one row per id, and the warnings and notes, judged from the facts.

Everything here is worded from what the readings and the CPU harness
already found (:class:`Facts`, built by :func:`patchcraft.analysis.explain.explanation`):
nothing here reads a file or runs code. A warning is a :class:`Finding`,
whose ``kind`` ``check-draft`` sorts on (:mod:`patchcraft.analysis.draft_check`).
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from patchcraft.analysis.target_model import (
    Model,
    Served,
    apply_helps,
    describe_state,
    hs,
    is_draft_head,
    states_text,
)
from patchcraft.harness import INSTALL_HINT
from patchcraft.planning.id_source import RELEASE_DEFAULT, IdSource, IdSourceKind
from patchcraft.planning.runner_resets import RunnerReset
from patchcraft.reading.class_graph import classes_assigned_to
from patchcraft.reading.setter_sandbox import SetterRun

if TYPE_CHECKING:
    from patchcraft.harness.outcomes import RunOutcome


@dataclass(frozen=True)
class IdRow:
    """One requested id: its ``layers_to_capture`` value and the state captured."""

    layer_id: int
    value: int | None  # None: -1 became the embedding flag
    state: int | None  # None: never captured
    note: str = ""


class FindingKind(str, enum.Enum):
    """What a warning is about: check-draft sorts on it; the JSON's ``warnings[].kind``."""

    #: The setter raises: the server fails at start-up.
    STARTUP = "startup"
    #: A setter that takes no ids: the defaults whatever the config says.
    LEGACY = "legacy"
    #: The static reading cannot tell what is served.
    UNKNOWN = "unknown"
    #: The forward crashes on the harness.
    CRASH = "crash"
    #: Nothing reaches the collector.
    NOTHING = "nothing"
    #: hs[0] is not (or not safely) the embedding.
    EMBEDDING = "embedding"
    #: An id out of range, or ids that collapse.
    RANGE = "range"
    #: A setter heuristic keeps the ids raw.
    HEURISTIC = "heuristic"
    #: CUDA-graph decode captures other layers.
    CUDA_GRAPH = "cuda-graph"
    #: A capture reads a per-rank partial sum at TP > 1.
    FUSION = "fusion"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@dataclass(frozen=True)
class Finding:
    """One warning: ``kind`` says what it is about (check-draft sorts on it)."""

    kind: FindingKind
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Facts:
    """What the warnings are judged from."""

    model: Model
    ids: tuple[int, ...] | None
    run: SetterRun
    rows: tuple[IdRow, ...]
    served: Served
    default: Served
    variant: str
    test: str
    rule: str
    resets: tuple[RunnerReset, ...]
    num_layers: int
    outcome: "RunOutcome | None" = None
    #: What is served (the run's states, or the static reading's) and for the default call.
    states: tuple[int, ...] = ()
    default_states: tuple[int, ...] = ()
    #: After ``patchcraft apply``, for -1 on an install apply would patch: the run (with ``outcome``), else the reading.
    after_run: "RunOutcome | None" = None
    after_static: Served | None = None
    #: Why the harness did not run the code though torch is there ("" when it ran, or without torch).
    not_run: str = ""
    #: Where the runner reads the ids it passes (:mod:`patchcraft.planning.id_source`).
    source: IdSource = RELEASE_DEFAULT


# -- one row per id ------------------------------------------------------------------


def id_rows(
    ids: tuple[int, ...] | None, run: SetterRun, reach: frozenset[int], outcome: "RunOutcome | None" = None
) -> tuple[IdRow, ...]:
    """Pair each id with its ``layers_to_capture`` value (the setters keep the order)."""
    if ids is None or run.layers_to_capture is None or not run.takes_ids:
        return ()
    values = list(run.layers_to_capture)
    pairs: list[tuple[int, int | None]]
    if run.embedding and -1 in ids and len(values) == len([i for i in ids if i != -1]):
        rest = iter(values)
        pairs = [(i, None if i == -1 else next(rest)) for i in ids]
    elif len(values) == len(ids):
        pairs = list(zip(ids, values))
    else:
        return ()
    return tuple(_row(layer_id, value, reach, outcome) for layer_id, value in pairs)


def _row(layer_id: int, value: int | None, reach: frozenset[int], outcome: "RunOutcome | None" = None) -> IdRow:
    if value is None:
        return IdRow(layer_id, None, 0, "embedding output (patchcraft capture)")
    if value not in reach:
        return IdRow(layer_id, value, None, "never captured")
    if value == 0:
        return _layer_zero_row(layer_id, outcome)
    return IdRow(layer_id, value, value, describe_state(value))


def _layer_zero_row(layer_id: int, outcome: "RunOutcome | None") -> IdRow:
    """``layers_to_capture`` 0: the run says whether the release crashes, aliases or copies there."""
    if outcome is None:
        return IdRow(
            layer_id, 0, 0, "embedding output if the capture at layer 0 survives residual None (unknown statically)"
        )
    if outcome.crash:
        return IdRow(layer_id, 0, None, f"crash: {outcome.crash}")
    first = outcome.fed[0] if outcome.fed else None
    if first is not None and first.state == 0:
        how = "a copy" if first.copy else "not a copy: layer 0 overwrites it in place"
        return IdRow(layer_id, 0, 0, f"embedding output, {how}")
    return IdRow(layer_id, 0, None, "never captured (run)")


# -- the warnings and notes ------------------------------------------------------------


def judge(facts: Facts) -> tuple[list[Finding], list[str]]:
    """The warnings and the notes, in the order they are printed."""
    warnings: list[Finding] = []
    notes: list[str] = []
    run, ids, outcome = facts.run, facts.ids, facts.outcome
    if run.error and not (outcome is not None and outcome.stage == "setter"):
        message = _no_apply_advice(_real_names(run.error, facts), facts.model)
        warnings.append(Finding(FindingKind.STARTUP, f"SGLang will fail at start-up: the setter raises {message}"))
    if not run.takes_ids and facts.source.passes_ids:
        setter = facts.run.calls[-1] if facts.run.calls else facts.model.label
        warnings.append(
            Finding(
                FindingKind.STARTUP,
                f"SGLang will fail at start-up: the runner passes the ids ({facts.source.call}) to {setter}, "
                "which takes none (TypeError: too many positional arguments)",
            )
        )
    elif not run.takes_ids and ids is not None:
        warnings.append(
            Finding(
                FindingKind.LEGACY,
                f"{facts.model.tree.noun}'s setter takes no ids: SGLang captures the default layers whatever the draft config says"
                " (`patchcraft apply` cannot change that: it patches only setters that take ids)",
            )
        )
    elif facts.source.kind is IdSourceKind.NONE and ids is not None:
        warnings.append(
            Finding(
                FindingKind.LEGACY,
                f"{facts.model.tree.noun}'s runner passes no ids to the setter ({facts.source.call}): "
                "SGLang captures the default layers whatever the draft config says",
            )
        )
    read = ids is not None and facts.source.kind is not IdSourceKind.NONE  # the setter gets these ids
    if read and run.takes_ids and not run.error:
        warnings += _range_warnings(facts)
    if facts.variant.endswith("heuristic") and read and run.layers_to_capture is not None:
        _heuristic_message(facts, warnings, notes)
    if outcome is not None:
        warnings += _run_findings(facts, outcome)
    elif facts.served.unknown:
        warnings.append(
            Finding(
                FindingKind.UNKNOWN,
                f"the static reading cannot tell what is served: {facts.served.unknown}; "
                f"install torch to run the code ({INSTALL_HINT})",
            )
        )
    if ids is not None and -1 in ids and not facts.model.patched:
        warnings.append(_unpatched_embedding(facts))
        after_note = _after_apply_note(facts)
        if after_note:
            notes.append(after_note)
    _runner_message(facts, warnings, notes)
    if facts.model.plan.unsupported and not is_draft_head(facts.model.plan):
        notes.append(f"patchcraft cannot patch this model for -1: {facts.model.plan.unsupported}")
    notes.append(_source_note(facts))
    notes.append("assumes one pipeline stage (setters return early on all but the last one)")
    return warnings, notes


def _run_findings(facts: Facts, outcome: "RunOutcome") -> list[Finding]:
    """What running the code showed: a crash, nothing captured, an embedding that is no copy."""
    if outcome.crash:
        when = "at start-up: the setter raises" if outcome.stage == "setter" else "on its first forward:"
        kind = FindingKind.STARTUP if outcome.stage == "setter" else FindingKind.CRASH
        return [Finding(kind, f"SGLang will crash {when} {_no_apply_advice(outcome.crash, facts.model)}")]
    if outcome.nothing:
        return [
            Finding(
                FindingKind.NOTHING,
                "nothing is captured: the setter and forward ran and no hidden state reached the collector, "
                "so the draft is fed nothing (EAGLE-3 cannot run on these ids here)",
            )
        ]
    found = []
    if not outcome.all_copies:
        found.append(
            Finding(
                FindingKind.EMBEDDING,
                "hs[0] reaches the collector as the embedding tensor itself, not a copy: "
                "layer 0's in-place residual add overwrites it before the draft reads it",
            )
        )
    unknown = [f.what for f in outcome.fed if f.state is None]
    if unknown:
        found.append(
            Finding(FindingKind.RANGE, f"the collector got {unknown[0]}, which is no hidden state of the target")
        )
    return found


def _source_note(facts: Facts) -> str:
    if facts.outcome is None and facts.not_run:
        return f"static reading, not a run: the served states are read from the code by rules; {facts.not_run}"
    if facts.outcome is None:
        return "static reading: the served states are read from the code by rules (with torch, the code is run instead)"
    text = "served states from running this install's setter and forward on the CPU harness (stand-in layers, docs/harness.md)"
    if facts.states != facts.served.states and facts.ids is not None:
        static = facts.served.unknown and "unknown" or states_text(facts.served.states)
        text += f"; the static reading says {static}"
    return text


def _real_names(error: str, facts: Facts) -> str:
    """A setter's message names ``type(self.model).__name__``: the static run's stand-in is no name to print."""
    if "StandIn" not in error:
        return error
    # ``self`` is the entry class (a delegate's setter runs on the delegate, the last call's owner).
    owner = facts.run.calls[-1].owner if len(facts.run.calls) > 1 else facts.model.cls
    inner = classes_assigned_to(facts.model.graph, owner, "model")
    return error.replace("StandIn", inner[0].name if inner else f"the inner model of {owner.name}")


def _no_apply_advice(error: str, model: Model) -> str:
    """A patched setter's own message says "run `patchcraft apply`"; where apply cannot help, say that instead."""
    if "patchcraft apply" not in error or apply_helps(model):
        return error
    cleaned = error.replace(" (run `patchcraft apply`)", "")
    return f"{cleaned}; `patchcraft apply` cannot help here ({model.patch_detail})"


def _after_apply_note(facts: Facts) -> str:
    if not apply_helps(facts.model):
        return ""
    if facts.outcome is not None:
        outcome = facts.after_run
        if outcome is not None and outcome.ran and not outcome.crash and outcome.fed:
            return f"after `patchcraft apply`, these ids serve {states_text(outcome.states)} (run)"
        return ""
    after = facts.after_static
    if after is not None and after.states and not after.run.error:
        return f"after `patchcraft apply`, these ids serve {states_text(after.states)}"
    return ""


def _range_warnings(facts: Facts) -> list[Finding]:
    warnings = []
    reach, n = facts.served.reachable, facts.num_layers
    for row in facts.rows:
        if row.state is None and row.value not in reach:  # a crash there is the run's finding, not a range
            span = f"captures {min(reach)}..{max(reach)}" if reach else "captures nothing"
            warnings.append(
                Finding(
                    FindingKind.RANGE,
                    f"id {row.layer_id} is out of range: layers_to_capture {row.value} is never captured "
                    f"(this forward {span} for {n} layers), so the draft gets fewer states than ids",
                )
            )
    if not facts.rows:
        warnings += [
            Finding(FindingKind.RANGE, f"id {i} is out of range for {n} layers")
            for i in facts.ids or ()
            if i < -1 or i > n
        ]
    values = [v for v in facts.run.layers_to_capture or () if v in reach]
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        warnings.append(
            Finding(
                FindingKind.RANGE,
                f"several ids become layers_to_capture {', '.join(map(str, repeated))}: each layer is captured once, "
                "so the draft gets fewer states than ids",
            )
        )
    return warnings


def test_holds(test: str, ids: tuple[int, ...] | None, num_layers: int) -> bool | None:
    """Whether the setter's heuristic test (``layer_ids and layer_ids[0] == 1``) holds for ``ids``; None: cannot tell.

    The test is the release's own expression, evaluated on the ids alone
    (its names: the ids parameter and ``num_layers``; no builtins but
    ``max``, ``min`` and ``len``).
    """
    if not test or ids is None:
        return None
    try:
        tree = ast.parse(test, mode="eval")
    except SyntaxError:
        return None
    allowed = {"max": max, "min": min, "len": len}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(allowed)
    values: dict[str, object] = {name: num_layers if name == "num_layers" else list(ids) for name in names}
    try:
        return bool(eval(compile(tree, "<heuristic>", "eval"), {"__builtins__": {}, **allowed}, values))
    except Exception:
        return None


def heuristic_words(test: str, ids: tuple[int, ...] | None, num_layers: int) -> str:
    """``the setter's test `X` is false for these ids``, or the test named without a claim when it cannot be evaluated."""
    holds = test_holds(test, ids, num_layers)
    if holds is None:
        return f"the setter's test `{test}`" if test else "the setter's heuristic"
    return f"the setter's test `{test}` is {'true' if holds else 'false'} for these ids"


def _heuristic_message(facts: Facts, warnings: list[Finding], notes: list[str]) -> None:
    said = heuristic_words(facts.test, facts.ids, facts.num_layers)
    kept = [i for i in facts.ids or () if i >= 0]  # -1 is no layer: never the example
    if facts.rule.startswith("ids kept raw") and kept:
        example = kept[0]
        warnings.append(
            Finding(
                FindingKind.HEURISTIC,
                f"{said}, so it keeps them raw: id {example} means {hs(example)} ({describe_state(example)}), "
                f"not {hs(example + 1)} as under the +1 rule; the test reads the whole list, so another list "
                "can change the meaning of every id",
            )
        )
    elif facts.rule.startswith("+1 rule") and facts.run.embedding:
        notes.append(
            "-1 is given, so the other ids are layer outputs (+1) whatever the setter's test would choose: "
            "patchcraft's setter gives one config one meaning on every release"
        )
    elif facts.rule.startswith("+1 rule"):
        notes.append(f"{said}, so the +1 rule applies; another list could make it keep the ids raw")


def _unpatched_embedding(facts: Facts) -> Finding:
    if 0 in (facts.run.layers_to_capture or ()):
        what = (
            "the setter turns it into layers_to_capture 0, a capture at the top of layer 0 where residual is None "
            "(some forwards crash there, others append an un-cloned embedding that layer 0 may overwrite in place)"
        )
    else:
        what = "no state is captured for it"
    if apply_helps(facts.model):
        fix = f"run `patchcraft apply` ({facts.model.patch_detail})"
    else:
        fix = f"`patchcraft apply` cannot help here ({facts.model.patch_detail})"
    return Finding(FindingKind.EMBEDDING, f"id -1 on an install not patched for -1: {what}; {fix}")


def _runner_message(facts: Facts, warnings: list[Finding], notes: list[str]) -> None:
    if not facts.resets:
        return
    where = ", ".join(r.where for r in facts.resets)
    if facts.run.takes_ids and facts.ids is not None and facts.states != facts.default_states:
        warnings.append(
            Finding(
                FindingKind.CUDA_GRAPH,
                f"CUDA-graph decode will capture the default layers ({states_text(facts.default_states)}), not these: "
                f"{facts.model.tree.noun} resets the ids before graph capture ({where}); "
                "run `patchcraft apply` (its runner edit passes the configured ids), or serve with --disable-cuda-graph",
            )
        )
    else:
        notes.append(f"{facts.model.tree.noun} resets the ids before CUDA-graph capture ({where})")
