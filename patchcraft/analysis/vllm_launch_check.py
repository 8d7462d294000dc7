"""``patchcraft run``'s check of an EAGLE-3 draft against what a vLLM tree will feed it.

The states the draft was trained on come from the training convention, as
for ``check-draft`` (:func:`patchcraft.analysis.training.expected_states`:
``--trained-on``, or a config whose format names its pipeline). What vLLM
feeds comes from running the release's own code (:func:`patchcraft.analysis.vllm_explain.explain_vllm`)
on the tree the server will import (the overlay's, patched), with the ids
where vLLM reads them: the draft config's top-level
``eagle_aux_hidden_state_layer_ids`` (none there: the model's defaults).

The verdict is ``ok`` only when the code ran, raised no warning (a crash,
a dropped or repeated id, an aliased embedding, a gate that refuses the
target), fed exactly the trained states in their order, and the draft's
fc takes that many states of the target's width. What cannot be checked
(torch missing, a target config without an architecture or a layer count,
a model the harness cannot run) is ``unchecked``, never ``ok``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from patchcraft.analysis.training import Training, expected_states
from patchcraft.analysis.vllm_explain import FindingKind, VllmExplanation, explain_vllm
from patchcraft.base.vllm_tree import VllmTree
from patchcraft.reading.draft_config import DraftConfig, TargetConfig


class Verdict(str, enum.Enum):
    OK = "ok"
    MISMATCH = "mismatch"
    UNCHECKED = "unchecked"


@dataclass(frozen=True)
class VllmDraftCheck:
    """What the check found: the verdict, why (one line), and the lines that say what was compared."""

    verdict: Verdict
    reason: str
    lines: tuple[str, ...] = ()
    explanation: VllmExplanation | None = None


def _hs(states: tuple[int, ...]) -> str:
    return "[" + ", ".join(f"hs[{s}]" for s in states) + "]"


def check_launch(
    package: Path, draft: DraftConfig, target: TargetConfig, training: Training | None, tp: int = 1
) -> VllmDraftCheck:
    """Compare what the vLLM tree ``package`` feeds ``draft`` for ``target`` with the states it was trained on."""
    if not target.architectures:
        return VllmDraftCheck(Verdict.UNCHECKED, f"{target.path} names no architecture: the model class is not known")
    if target.num_layers is None:
        return VllmDraftCheck(Verdict.UNCHECKED, f"{target.path} has no num_hidden_layers")
    architecture, layers = target.architectures[0], target.num_layers
    hidden = target.hidden_size or draft.target_hidden_size or draft.hidden_size
    fc_states = draft.fc_in // hidden if draft.fc_in and hidden and draft.fc_in % hidden == 0 else None
    expected = expected_states(training, draft, fc_states, layers, (), draft.is_speculators)
    if expected is None:
        return VllmDraftCheck(Verdict.UNCHECKED, "how the draft was trained is not known")
    ids = draft.top_level_ids
    tree = VllmTree(package=package, root=package.parent)
    explanation = explain_vllm(tree, architecture, ids, layers, tp)
    where = (
        f"eagle_aux_hidden_state_layer_ids {list(ids)}"
        if ids is not None
        else "no top-level eagle_aux_hidden_state_layer_ids (vLLM serves the model's defaults)"
    )
    lines = [
        f"vLLM {explanation.version}, {explanation.model}, {layers} layers; the draft's config: {where}",
        f"vLLM feeds the draft: {explanation.fed}",
        f"trained on: {_hs(expected.states)} ({expected.how})",
    ]
    lines += [f"note: {n.text}" for n in explanation.notes]
    if not explanation.ran:
        return VllmDraftCheck(Verdict.UNCHECKED, "torch is not installed: vLLM's code was not run", tuple(lines))
    not_run = [f.text for f in explanation.findings if f.kind == FindingKind.NOT_RUN]
    if not_run:
        return VllmDraftCheck(Verdict.UNCHECKED, f"vLLM's code could not run: {not_run[0]}", tuple(lines), explanation)
    problem = _problem(draft, target, expected.problem, expected.states, explanation, hidden)
    if problem:
        return VllmDraftCheck(Verdict.MISMATCH, problem, tuple(lines), explanation)
    return VllmDraftCheck(
        Verdict.OK, f"ok: vLLM will feed the draft {_hs(expected.states)}, as trained", tuple(lines), explanation
    )


def _problem(
    draft: DraftConfig,
    target: TargetConfig,
    trained_problem: str,
    trained: tuple[int, ...],
    explanation: VllmExplanation,
    hidden: int | None,
) -> str:
    """The first reason the launch would feed the draft other states than it was trained on ("" when none)."""
    if explanation.findings:
        return explanation.findings[0].text
    if trained_problem:
        return trained_problem
    fed = explanation.fed_states
    if fed != trained:
        return f"vLLM will feed {_hs(fed)} but the draft was trained on {_hs(trained)}"
    width = draft.target_hidden_size
    if width is not None and target.hidden_size is not None and width != target.hidden_size:
        return (
            f"the draft's target_hidden_size is {width} but the target's hidden_size is {target.hidden_size}: "
            "this draft was trained for another target"
        )
    if draft.fc_in is not None and hidden is not None and draft.fc_in != hidden * len(fed):
        return f"the draft's fc takes {draft.fc_in} inputs but vLLM will feed {len(fed)} states of width {hidden}"
    return ""
