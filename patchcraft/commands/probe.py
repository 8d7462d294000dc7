"""``patchcraft probe``: which hidden states a draft's weights expect, measured on its training states."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.analysis.probe import ProbeInputs, ProbeReport, probe, served_states, states_text
from patchcraft.base.errors import PatchcraftError
from patchcraft.commands.explain import resolve_tree
from patchcraft.harness import torch_problem
from patchcraft.ui import console, documents
from patchcraft.ui.choices import OutputFormat
from patchcraft.ui.machine_output import verdict_code
from patchcraft.ui.messages import SMOKE_EXTRA


@dataclass(frozen=True)
class ProbeOptions:
    draft_dir: str
    data: str
    target: str | None = None  # the SGLang tree whose draft code runs
    release: str | None = None
    overlay: str | None = None
    target_model: str | None = None  # the target's directory: config.json, and its embedding when the draft has none
    states: str | None = None
    served: str | None = None
    model: str | None = None
    num_layers: int | None = None
    tokens: int = 512
    top_k: int = 4
    output_format: OutputFormat = OutputFormat.TEXT
    report: str | None = None  # write the JSON document here too (for check-draft --trained-on measured:REPORT)


def parse_states(text: str, option: str) -> tuple[int, ...]:
    """``hf:0,3,31`` (or ``0,3,31``) -> ``(0, 3, 31)``; anything else is one line."""
    value = text.strip().lower()
    value = value[3:] if value.startswith("hf:") else value
    try:
        states = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        states = ()
    if not states or any(s < 0 for s in states) or len(set(states)) != len(states):
        raise PatchcraftError(
            f"{option} {text!r}: expected hf:I,J,K (distinct Hugging Face hidden_states indices, 0 = embedding)"
        )
    return states


def probe_command(options: ProbeOptions) -> int:
    """Print the measured wirings; exit 0 when the install feeds the best one, 1 when not, 2 on bad input."""
    problem = torch_problem()
    if problem is not None:
        raise PatchcraftError(f"patchcraft probe runs the draft's weights with torch, which {problem}: {SMOKE_EXTRA}")
    draft_dir = Path(options.draft_dir)
    draft = read_draft(draft_dir)
    target_dir = Path(options.target_model) if options.target_model else None
    target = read_target(target_dir) if target_dir is not None else None
    tree = resolve_tree(options.target, options.release, options.overlay)
    states = parse_states(options.states, "--states") if options.states else None
    served, how, strict = None, "", False
    if options.served:
        served, how, strict = parse_states(options.served, "--served"), "--served", True
    else:
        num_layers = options.num_layers or (target.num_layers if target else None)
        name = options.model or (target.architectures[0] if target and target.architectures else None)
        if num_layers is not None and name is not None:
            served, how = served_states(tree, name, draft.layer_ids, num_layers)
    shown = options.output_format != OutputFormat.JSON
    with console.progress("probing the draft", shown=shown, unit="wirings") as status:
        inputs = ProbeInputs(
            draft_dir=draft_dir,
            data=Path(options.data),
            tree=tree,
            states=states,
            target_dir=target_dir,
            tokens=options.tokens,
            top_k=options.top_k,
            served=served,
            served_how=how,
            served_strict=strict,
            progress=lambda label, done, total: status.update(label, done, total),
        )
        report = probe(inputs)
    code = verdict_code(report.ok)
    if options.report:
        write_report(Path(options.report), documents.probe_json(report, code))
    return console.print_report(
        options.output_format, code, lambda: documents.probe_json(report, code), lambda: report_text(report)
    )


def write_report(path: Path, document: dict) -> None:
    """The JSON document at ``path``, whole or not at all (written beside it, then renamed)."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise PatchcraftError(f"--report {path}: cannot write ({exc.strerror})") from None


def _pct(rate: float) -> str:
    return f"{rate * 100:.0f}%"


def report_text(report: ProbeReport, shown: int = 5) -> str:
    dump, best = report.dump, report.best
    lines = [
        f"draft    {report.draft} ({report.engine} {report.version}: {report.draft_code.name})",
        f"data     {dump.path}: {dump.format}, {len(dump.files)} file(s), holds {states_text(dump.states)} "
        f"(named by {dump.named_by}), {dump.hidden_size} wide",
        f"embed    {report.embedding}",
        f"scored   {report.tokens} positions, {report.wirings} wirings, top-{report.top_k}",
        "",
    ]
    for rank, score in enumerate(report.scores[:shown], 1):
        lines.append(
            f"  {rank:>3}. {states_text(score.states):<32} top-1 {_pct(score.top1):>4}  top-{report.top_k} "
            f"{_pct(score.topk):>4}  ({score.tokens} positions)"
        )
    lines.append("")
    lines.append(
        f"the weights expect {states_text(best.states)} (top-1 {_pct(best.top1)}; "
        f"{report.margin * 100:.0f} points over the next)"
    )
    served = report.served
    if served is not None:
        if served.score is not None:
            lines.append(
                f"this install feeds {states_text(served.states)} (top-1 {_pct(served.score.top1)}; "
                f"rank {served.rank} of {len(report.scores)}) [{served.how}]"
            )
        else:
            lines.append(
                f"this install feeds {states_text(served.states)}, not measured: {served.problem} [{served.how}]"
            )
        if served.rank != 1:
            ids = ",".join(map(str, best.states))
            lines.append(
                f"next: patchcraft check-draft {report.draft} --trained-on hf:{ids} (or measured:REPORT with --report REPORT) "
                "for the ids that feed it"
            )
    else:
        lines.append(
            "served wiring not compared: pass --target DIR (or --model and --num-layers), or --served hf:I,J,K"
        )
    return "\n".join(lines) + "\n"
