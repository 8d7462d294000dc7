"""``patchcraft engine env`` and ``patchcraft engine check``: the real engine, on this machine's CPU, as the judge.

``engine env`` builds (or reuses) an engine release's environment in the
cache and prints its interpreter. ``engine check`` runs one case: a tiny
random target of the class, a tiny EAGLE-3 draft for the ids, the real
engine as installed (or, ``--patched``, through ``patchcraft run`` with
the overlay of that install), and reports which hidden state each entry of
the draft's input was, next to what ``explain`` predicts for the same
platform and compilation, with greedy equality against the target alone
and the engine's own speculative-decoding counters. Exit 0 when the engine
and the prediction agree, 1 when they do not (both named), 2 when the
environment cannot be had (one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from patchcraft.base.layer_ids import parse_layer_ids
from patchcraft.real_engine import environments
from patchcraft.real_engine.check import DIALECTS, Case, Outcome, run_case, tier
from patchcraft.ui import console
from patchcraft.base.errors import CHANGED, OK, PatchcraftError


@dataclass(frozen=True)
class EngineCheckOptions:
    engine: str
    release: str | None
    model: str
    layer_ids: str
    num_layers: int
    patched: bool
    norm: str
    compilation: str
    output_format: str = "text"
    draft: Optional[str] = None
    server: bool = False
    target: Optional[str] = None
    max_tokens: int = 8
    prompts: Optional[str] = None


def engine_env_command(engine: str, release: str | None, remove: bool) -> int:
    dialect = DIALECTS[engine]
    spec = dialect.env_spec(release or dialect.DEFAULT_RELEASE)
    if remove:
        gone = environments.remove(spec)
        console.print_line(f"engine environment {spec.name}: {'removed' if gone else 'not there'}")
        return OK
    env = environments.ensure(spec, console.print_line)
    return console.print_report("text", OK, dict, lambda: f"{env.python}\n")


def engine_check_command(options: EngineCheckOptions) -> int:
    ids = parse_layer_ids(options.layer_ids)
    case = Case(
        options.engine,
        options.release or DIALECTS[options.engine].DEFAULT_RELEASE,
        options.model,
        tuple(ids) if ids is not None else None,
        options.num_layers,
        options.patched,
        options.norm,
        options.compilation,
        draft_dir=options.draft,
        server=options.server,
        target_dir=options.target,
        max_tokens=options.max_tokens,
        prompts=_prompts(options.prompts),
    )
    outcome = run_case(case, console.print_line)
    code = OK if outcome.agree else CHANGED
    return console.print_report(
        options.output_format,
        code,
        lambda: outcome_json(outcome, code),
        lambda: "\n".join(outcome_lines(outcome)) + "\n",
    )


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def _prompts(path: Optional[str]) -> Optional[tuple[tuple[int, ...], ...]]:
    """``--prompts FILE``: a JSON list of token-id lists; one line for anything else."""
    if path is None:
        return None
    import json

    try:
        value = json.loads(open(path, encoding="utf-8").read())
    except (OSError, ValueError) as exc:
        raise PatchcraftError(f"--prompts {path}: cannot read it as JSON ({exc})") from None
    if not (
        isinstance(value, list)
        and value
        and all(isinstance(p, list) and p and all(isinstance(t, int) and t >= 0 for t in p) for p in value)
    ):
        raise PatchcraftError(f"--prompts {path}: expected a JSON list of token-id lists, e.g. [[5, 17, 42], [9, 8]]")
    return tuple(tuple(p) for p in value)


def outcome_lines(outcome: Outcome) -> list[str]:
    case, result, prediction = outcome.case, outcome.result, outcome.prediction
    ids = list(case.layer_ids) if case.layer_ids is not None else "none"
    metrics = result.get("spec_metrics") or {}
    lines = [
        f"engine     {ENGINE_NAMES[case.engine]} {result.get('engine_version', case.release)} ({tier(result)}), "
        f"{outcome.served}: {outcome.tree}",
        f"case       {case.model} ({case.num_layers} layers, tiny random), draft ids {ids}, {prediction.setting}",
    ]
    if result.get("kernels") is not None:  # read after the run: a failed run has none to show
        lines.append(f"kernels    {result['kernels']}")
    error = result.get("error")
    if error:
        lines.append(
            f"engine     failed: {error.get('type')}: {error.get('message', '')[:200]} at {error.get('file')}:{error.get('line')}"
        )
    if error and result.get("fed"):
        lines.append(f"fed        {', '.join(outcome.fed)} (the draft's input before the failure, {_matched(result)})")
    if not error:
        lines.append(f"fed        {', '.join(outcome.fed) or 'nothing recorded'} ({_matched(result)})")
        if "reference_tokens" in result:
            equal = "equal" if result.get("greedy_equal") else "DIFFERENT"
            lines.append(
                f"greedy     {equal} to {result.get('reference')}: {result.get('tokens')} vs {result.get('reference_tokens')}"
            )
        else:
            lines.append(f"greedy     {result.get('tokens')} (not compared: {result.get('reference')})")
        lines.append(
            "spec       drafts {d}, draft tokens {t}, accepted {a}, per position {p}, mean accept length {m}".format(
                d=metrics.get("spec_decode_num_drafts"),
                t=metrics.get("spec_decode_num_draft_tokens"),
                a=metrics.get("spec_decode_num_accepted_tokens"),
                p=metrics.get("spec_decode_num_accepted_tokens_per_pos"),
                m=metrics.get("mean_accept_length"),
            )
        )
    lines += [f"note       {note}" for note in result.get("notes", [])]
    predicted = prediction.crash or ", ".join(prediction.fed)
    if prediction.count and not prediction.crash:
        predicted += f" ({prediction.count})"
    lines.append(f"explain    {predicted} (patchcraft's prediction, the CPU harness on the same tree)")
    lines.append(("agree      " if outcome.agree else "MISMATCH   ") + outcome.why)
    return lines


def _matched(result: dict) -> str:
    if result.get("standins") is not None:
        return "each entry matched to the engine's own recorded states, hs[k]"
    return "the real engine: each entry matched to the target's own hs[k]"


def outcome_json(outcome: Outcome, code: int) -> dict:
    from patchcraft.ui.machine_output import SCHEMA_VERSION

    case = outcome.case
    return {
        "schema": SCHEMA_VERSION,
        "command": "engine check",
        "engine": case.engine,
        "release": case.release,
        "model": case.model,
        "layer_ids": list(case.layer_ids) if case.layer_ids is not None else None,
        "num_layers": case.num_layers,
        "patched": case.patched,
        "served": outcome.served,
        "norm": case.norm,
        "compilation": case.compilation,
        "environment": outcome.environment,
        "tree": outcome.tree,
        "real": {k: v for k, v in outcome.result.items() if k != "error"}
        | {"error": _error(outcome.result.get("error"))},
        "predicted": {
            "fed": list(outcome.prediction.fed),
            "crash": outcome.prediction.crash or None,
            "setting": outcome.prediction.setting,
        },
        "agree": outcome.agree,
        "why": outcome.why,
        "exit_code": code,
    }


def _error(error: Optional[dict]) -> Optional[dict]:
    return None if not error else {k: v for k, v in error.items() if k != "traceback"}
