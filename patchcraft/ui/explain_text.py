"""``explain``'s text: the setter, the rule, one row per id and what the draft is fed (docs/layer-ids.md).

Built from the :class:`~patchcraft.analysis.explain.Explanation` record;
its JSON document is :func:`patchcraft.ui.documents.explanation_json`.
``check-draft`` prints the fed line and its source the same way.
"""

from __future__ import annotations

from patchcraft.analysis.explain import Explanation
from patchcraft.analysis.target_model import RUN, hs, states_text


def explanation_text(result: Explanation) -> str:
    lines = [
        f"sglang {result.version} at {result.package}",
        f"model    {result.model}, {result.num_layers} layers",
        "setter   " + "\n      -> ".join(result.calls or (result.setter,)),
        f"rule     {result.rule}",
        f"install  {result.patch_detail}",
    ]
    if result.id_source is not None:
        lines.append(f"ids from {result.id_source.text}")
    lines += [""]
    if result.rows:
        lines.append(f"  {'id':>4}  {'layers_to_capture':<18} captures")
        for row in result.rows:
            value = "(embedding flag)" if row.value is None else str(row.value)
            state = hs(row.state) if row.state is not None else "-"
            lines.append(f"  {row.layer_id:>4}  {value:<18} {state:<7} {row.note}")
        lines.append("")
    elif result.layers_to_capture is not None:
        lines.append(f"layers_to_capture = {list(result.layers_to_capture)}")
    count = len(result.served)
    lines.append(
        f"SGLang feeds the draft: {fed_line(result)} ({count} state{'s' if count != 1 else ''}, in layer order; {source_line(result)})"
    )
    if result.fusion_cost is not None:
        lines.append(f"fusion cost: {result.fusion_cost.text}")
    lines += [f"warning: {w}" for w in result.warnings]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def fed_line(result: Explanation) -> str:
    """The states fed: the run's (each named, a copy or not) or the static reading's ("unknown" where it cannot tell)."""
    if result.outcome is None:
        return "unknown" if result.static_unknown else states_text(result.served)
    from patchcraft.harness.outcomes import fed_text

    return fed_text(result.outcome)


def source_line(result: Explanation) -> str:
    if result.source == RUN:
        return "by running the code on the CPU harness"
    if result.not_run:
        return "static reading: the code could not be run on the CPU harness, see the note"
    return "static reading"
