"""``patchcraft explain``: which hidden states a list of aux layer ids captures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchcraft import __version__
from patchcraft.ui import console
from patchcraft.analysis.explain import Explanation, describe_state, explain, hs, load_model, states_text
from patchcraft.commands._targets import release_targets
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.layer_ids import parse_layer_ids
from patchcraft.ui.machine_output import CHANGED, OK, SCHEMA_VERSION
from patchcraft.base.target import SglangTree, resolve_target


@dataclass(frozen=True)
class ExplainOptions:
    layer_ids: str
    num_layers: int
    target: str | None = None
    release: str | None = None
    model: str | None = None
    output_format: str = "text"
    #: Tensor parallelism the server runs with (all-reduce fusion matters only above 1).
    tp: int = 1
    #: An overlay directory (patchcraft overlay build): its files are the ones the server imports.
    overlay: str | None = None


def resolve_tree(target: str | None, release: str | None, overlay: str | None = None) -> SglangTree:
    """TARGET, or ``--release X`` (fetched into the cache), or the installed sglang; or an overlay's tree.

    An overlay (``--overlay DIR``, or its ``tree/sglang`` as TARGET) is taken only when it is safe to serve
    (:func:`patchcraft.overlay.check.overlay_target`): a verdict is never given on files a server would not import.
    """
    from patchcraft.overlay.check import overlay_target, require_usable_tree

    if overlay is not None:
        if target or release:
            raise PatchcraftError("--overlay is the target: give no TARGET or --release with it")
        return resolve_target(str(overlay_target(Path(overlay))))
    (chosen,) = release_targets((target,) if target else (), release) or (None,)
    tree = resolve_target(chosen)
    require_usable_tree(tree.package)
    return tree


def explain_command(options: ExplainOptions) -> int:
    """Print the explanation; exit 1 when any id will not capture what it says."""
    tree = resolve_tree(options.target, options.release, options.overlay)
    model = load_model(tree, options.model)
    result = explain(model, parse_layer_ids(options.layer_ids), options.num_layers, tp=options.tp)
    code = CHANGED if result.warnings else OK
    return console.print_report(
        options.output_format, code, lambda: explanation_json(result, code), lambda: explanation_text(result)
    )


def explanation_text(result: Explanation) -> str:
    lines = [
        f"sglang {result.version} at {result.package}",
        f"model    {result.model}, {result.num_layers} layers",
        "setter   " + "\n      -> ".join(result.calls or (result.setter,)),
        f"rule     {result.rule}",
        f"install  {result.patch_detail}",
        "",
    ]
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
    lines += [f"warning: {w}" for w in result.warnings]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def fed_line(result: Explanation) -> str:
    if result.outcome is None:
        return "unknown" if result.static_unknown else states_text(result.served)
    from patchcraft.harness.served import fed_text

    return fed_text(result.outcome)


def source_line(result: Explanation) -> str:
    return "by running the code on the CPU harness" if result.source == "run" else "static reading"


def run_json(result: Explanation) -> dict[str, Any] | None:
    """The run's record: each state fed and whether it is a copy, or the crash."""
    outcome = result.outcome
    if outcome is None:
        return None
    return {
        "fed": [{"hs": f.state, "copy": f.copy, "what": f.what} for f in outcome.fed],
        "crash": outcome.crash or None,
        "crash_in": outcome.stage or None,
    }


def explanation_json(result: Explanation, code: int) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "patchcraft": __version__,
        "command": "explain",
        "sglang_version": result.version,
        "package": result.package,
        "model": result.model,
        "num_layers": result.num_layers,
        "setter_calls": list(result.calls),
        "variant": result.variant,
        "rule": result.rule,
        "patched": result.patched,
        "install": result.patch_detail,
        "layer_ids": list(result.layer_ids) if result.layer_ids is not None else None,
        "layers_to_capture": list(result.layers_to_capture) if result.layers_to_capture is not None else None,
        "embedding": result.embedding,
        "ids": [
            {
                "id": row.layer_id,
                "layers_to_capture": row.value,
                "hs": row.state,
                "state": describe_state(row.state) if row.state is not None else None,
                "note": row.note,
            }
            for row in result.rows
        ],
        "served": list(result.served),
        "served_source": result.source,
        "run": run_json(result),
        "static_served": None if result.static_unknown else list(result.static_served),
        "static_unknown": result.static_unknown or None,
        "default_served": list(result.default_served),
        "cuda_graph_resets": [r.where for r in result.resets],
        "warnings": [{"kind": w.kind, "message": w.message} for w in result.warnings],
        "notes": list(result.notes),
        "exit_code": code,
    }
