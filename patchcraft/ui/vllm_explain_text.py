"""``explain --engine vllm``'s text and JSON, from the :class:`~patchcraft.analysis.vllm_explain.VllmExplanation` record,
and ``check-draft --engine vllm``'s report text (also what ``patchcraft run``'s vLLM preflight prints), from the
:class:`~patchcraft.analysis.vllm_draft_check.VllmDraftReport`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from patchcraft import __version__
from patchcraft.analysis.vllm_explain import NO_TARGET, VllmExplanation, default_runner
from patchcraft.reading.vllm_runner import PLACES
from patchcraft.ui.machine_output import SCHEMA_VERSION

if TYPE_CHECKING:
    from patchcraft.analysis.vllm_draft_check import VllmDraftReport


def _ids(ids: Any) -> str:
    return "none" if ids is None else "[" + ", ".join(str(i) for i in ids) + "]"


def _via(via: str) -> str:
    where, _, wrapper = via.partition(" ")
    return f", the language model of {wrapper} ({where})" if via else ""


def vllm_explanation_text(result: VllmExplanation) -> str:
    gate = (
        "none (every target with the EAGLE-3 interface)"
        if result.gate.names is None
        else f"model_type must contain one of {list(result.gate.names)} ({result.gate.where}); "
        f"{result.model_type!r}: {'admitted' if result.gate.admits(result.model_type) else 'refused'}"
    )
    lines = [
        f"vllm {result.version} at {result.package}",
        f"model    {result.model}{_via(result.via)} (model_type {result.model_type}), {result.num_layers} layers",
        f"ids      {_ids(result.layer_ids)} (vLLM: id X is hs[X], the state at the top of layer X)",
        f"gate     {gate}",
    ]
    for runner in result.runners:
        head = f"runner   {runner.name}{' [default]' if runner.default else ''}: "
        if not runner.function:
            lines.append(head + f"never reads the draft's ids; sets the defaults ({runner.default_getter})")
            continue
        if runner.error:
            lines.append(head + f"{runner.function} could not run: {runner.error}")
            continue
        read = ", ".join(
            f"{place}: {_ids(runner.ids_for(place)) if runner.ids_for(place) is not None else 'not read'}"
            for place in PLACES
        )
        lines.append(head + f"{runner.function}; {read}")
    lines.append(f"defaults {_ids(result.defaults) if result.defaults else 'unknown'}")
    lines.append(f"platform {_judged(result)}")
    if result.alone:
        lines += ["", f"  {'id':>4}  set alone, the draft gets"]
        lines += [f"  {entry.layer_id:>4}  {entry.fed}" for entry in result.alone]
    chosen = default_runner(result.runners)
    via = f"the {chosen.name}" if chosen is not None else "the runner"
    if result.fed == NO_TARGET or result.fed.startswith("not run"):
        lines += ["", f"vLLM feeds the draft: {result.fed}"]
    else:
        lines += ["", f"vLLM feeds the draft (ids {_ids(result.served_ids)} set by {via}): {result.fed}"]
    lines += [f"warning: {finding.text}" for finding in result.findings]
    lines += [f"note: {finding.text}" for finding in result.notes]
    return "\n".join(lines) + "\n"


def _judged(result: VllmExplanation) -> str:
    """The settings judged, and each one's add-norm (in place or not) as read from the release."""
    shown = [
        n
        for n in result.norms
        if (result.platform is None or n.platform == result.platform)
        and (result.compilation is None or n.compilation == result.compilation)
    ]
    served = f"{', '.join(result.served_on)}: the platforms that serve this class" if result.served_on else ""
    which = result.platform or served or "every platform"
    if result.compilation:
        which += f", {result.compilation}"
    marks = {True: "in place", False: "out of place", None: "not settled"}
    norms = "; ".join(f"{n.label}: {n.kernel} ({marks[n.in_place]})" for n in shown)
    return f"{which} (--platform, --compilation); fused add-norm: {norms or 'not read'}"


def vllm_explanation_json(result: VllmExplanation, code: int) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "patchcraft": __version__,
        "command": "explain",
        "engine": "vllm",
        "version": result.version,
        "package": result.package,
        "model": result.model,
        "via": result.via or None,
        "model_type": result.model_type,
        "num_layers": result.num_layers,
        "layer_ids": list(result.layer_ids) if result.layer_ids is not None else None,
        "gate": {
            "names": list(result.gate.names) if result.gate.names is not None else None,
            "where": result.gate.where,
            "admits": result.gate.admits(result.model_type),
        },
        "runners": [
            {
                "name": r.name,
                "default": r.default,
                "function": r.function or None,
                "default_getter": r.default_getter,
                "reads": {place: (list(ids) if ids is not None else None) for place, ids in r.resolved},
                "error": r.error or None,
            }
            for r in result.runners
        ],
        "defaults": list(result.defaults),
        "platform": result.platform,
        "served_on": list(result.served_on) or None,
        "compilation": result.compilation,
        "norms": [
            {
                "platform": n.platform,
                "compilation": n.compilation,
                "in_place": n.in_place,
                "kernel": n.kernel,
                "why": n.why,
            }
            for n in result.norms
        ],
        "served_ids": list(result.served_ids),
        "fed": result.fed,
        "fed_states": list(result.fed_states),
        "alone": [
            {"id": a.layer_id, "fed": a.fed, "states": list(a.states), "copies": a.copies, "crash": a.crash or None}
            for a in result.alone
        ],
        "warnings": [{"kind": str(f.kind), "text": f.text} for f in result.findings],
        "notes": [{"kind": str(f.kind), "text": f.text} for f in result.notes],
        "ran": result.ran,
        "exit_code": code,
    }


# -- check-draft --engine vllm ----------------------------------------------------------------------

_MARKS = {True: "ok  ", False: "FAIL", None: "skip"}


def vllm_report_head(report: VllmDraftReport) -> list[str]:
    """What was compared: the draft's ids, the release and its runner, what it serves, what the draft was trained on."""
    from patchcraft.analysis.target_model import states_text

    result = report.explanation
    draft = report.draft
    runner = default_runner(result.runners)
    via = (
        f", the language model of {result.via.partition(' ')[2]} ({result.via.partition(' ')[0]})" if result.via else ""
    )
    top = list(draft.top_level_ids) if draft.top_level_ids is not None else "none"
    lines = [f"draft    {draft.path}: top-level eagle_aux_hidden_state_layer_ids {top}"]
    lines.append(
        f"vllm     {result.version}: {result.model}{via}; {runner.name + ' [default]' if runner else 'no runner'}"
    )
    ids = f"ids {list(report.ids)} from {report.read_from}" if report.ids is not None else "the defaults"
    lines.append(
        f"serves   {result.fed} ({ids}; by running the code on the CPU harness)"
        if result.ran
        else f"serves   {result.fed}"
    )
    if report.expected is not None:
        lines.append(f"trained  {states_text(report.expected.states)} ({report.expected.how})")
    return lines


def vllm_report_text(report: VllmDraftReport, where: str) -> str:
    """The whole report: what was compared, each check, the verdict, and every proven fix (``where``: the tree as
    ``patchcraft apply`` names it)."""
    from patchcraft.analysis.vllm_draft_check import fix_text

    result = report.explanation
    lines = vllm_report_head(report)
    lines.append("")
    lines += [f"  {_MARKS[c.ok]}  {c.name:<12} {c.message}" for c in report.checks]
    lines.append("")
    lines.append(("mismatch: " if not report.ok else "") + report.verdict)
    for index, fix in enumerate(report.fixes):
        lines.append(("suggested: " if index == 0 else "  or: ") + fix_text(fix, report.ids, result.version, where))
        lines.append(
            f"    {list(fix.ids)} is what vLLM {result.version}'s default runner reads and feeds; another release "
            "may read other fields or feed other states for the same list (docs/vllm.md)"
        )
    if not report.ok and report.blocked:
        lines.append(
            ("no other way passes" if report.fixes else "no fix passes the whole check once applied")
            + "; what fails with each way tried:"
        )
        for b in report.blocked:
            more = (
                f" ({b.others} more id list{'s' if b.others > 1 else ''} tried this way fail too)" if b.others else ""
            )
            lines.append(f"  {b.way}: {b.why}{more}")
    if not report.ok and report.apply_note:
        lines.append(f"no fix with the vLLM patch was tried: {report.apply_note}")
    return "\n".join(lines) + "\n"
