"""``patchcraft check-draft``: will this install feed the draft what it was trained on?"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from patchcraft.ui import console, documents
from patchcraft.ui.choices import OutputFormat
from patchcraft.commands.explain import resolve_tree
from patchcraft.ui.explain_text import fed_line, source_line
from patchcraft.analysis.draft_check import DraftReport, check_draft, speculators_note
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.base.errors import PatchcraftError
from patchcraft.analysis.target_model import load_model, states_text
from patchcraft.ui.machine_output import verdict_code
from patchcraft.analysis.training import parse_training


@dataclass(frozen=True)
class CheckDraftOptions:
    draft_dir: str
    target_model: str | None = None
    target: str | None = None
    release: str | None = None
    model: str | None = None
    num_layers: int | None = None
    trained_on: str | None = None
    cuda_graph: bool = True
    output_format: OutputFormat = OutputFormat.TEXT
    #: Tensor parallelism the server runs with (all-reduce fusion matters only above 1).
    tp: int = 1
    #: An overlay directory: its files are the ones the server imports (``patchcraft run``).
    overlay: str | None = None
    #: False: the server runs with --enforce-disable-flashinfer-allreduce-fusion.
    allreduce_fusion: bool = True


def check_draft_command(options: CheckDraftOptions) -> int:
    """Print the checks; exit 0 when they pass, 1 on a mismatch, 2 on bad input."""
    training = parse_training(options.trained_on) if options.trained_on else None
    if training is not None and training.deprecation:
        console.print_line(f"warning: {training.deprecation}")
    draft = read_draft(Path(options.draft_dir))
    target = read_target(Path(options.target_model)) if options.target_model else None
    num_layers = options.num_layers or (target.num_layers if target else None)
    if num_layers is None:
        raise PatchcraftError("the target's layer count is unknown: pass --target TARGET_MODEL_DIR or --num-layers N")
    name = options.model or (target.architectures[0] if target and target.architectures else None)
    tree = resolve_tree(options.target, options.release, options.overlay)
    model = load_model(tree, name)
    report = check_draft(
        model,
        draft,
        target,
        training,
        num_layers,
        cuda_graph=options.cuda_graph,
        tp=options.tp,
        allreduce_fusion=options.allreduce_fusion,
    )
    code = verdict_code(report.ok)
    return console.print_report(
        options.output_format, code, lambda: documents.check_draft_json(report, code), lambda: report_text(report)
    )


def report_text(report: DraftReport) -> str:
    draft, result = report.draft, report.explanation
    ids = list(draft.layer_ids) if draft.layer_ids is not None else "none"
    lines = [
        f"draft    {draft.path}: eagle_aux_hidden_state_layer_ids {ids}, target_hidden_size {draft.target_hidden_size or '-'}, "
        + (draft.fc_source if draft.fc_in is not None else "fc width unknown"),
    ]
    if speculators_note(draft):
        lines.append(f"         {speculators_note(draft)}")
    if report.target is not None:
        arch = report.target.architectures[0] if report.target.architectures else "?"
        lines.append(
            f"target   {report.target.path}: {arch}, {report.target.num_layers} layers, hidden {report.target.hidden_size}"
        )
    lines += [
        f"sglang   {result.version}: {result.model} ({result.rule}); {result.patch_detail}",
        f"serves   {fed_line(result)} ({source_line(result)})",
    ]
    if result.fusion_cost is not None:
        lines.append(f"fusion   cost: {result.fusion_cost.text}")
    if report.expected is not None:
        lines.append(f"trained  {states_text(report.expected.states)} ({report.expected.how})")
        lines += [f"         {note}" for note in report.training_notes]
    lines.append("")
    marks = {True: "ok  ", False: "FAIL", None: "skip"}
    lines += [f"  {marks[c.ok]}  {c.name:<12} {c.message}" for c in report.checks]
    lines.append("")
    lines.append(("mismatch: " if not report.ok else "") + report.verdict)
    if report.suggestion_text:
        lines.append(f"suggested: {report.suggestion_text}" if report.fixes else report.suggestion_text)
    return "\n".join(lines) + "\n"
