"""``patchcraft check-draft``: will this install feed the draft what it was trained on?

``--engine sglang,vllm`` (or ``vllm``): each engine's verdict for the same
draft, the ids to set for each, and one config for both (docs/check-draft.md,
"Both engines"); without ``--engine``, SGLang's alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from patchcraft.ui import console, documents
from patchcraft.ui.choices import OutputFormat
from patchcraft.commands.explain import resolve_tree
from patchcraft.ui.explain_text import fed_line, source_line
from patchcraft.analysis.draft_check import DraftReport, check_draft, speculators_note
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.base.errors import PatchcraftError
from patchcraft.analysis.target_model import Model, load_model, states_text
from patchcraft.ui.machine_output import verdict_code
from patchcraft.analysis.training import parse_training
from patchcraft.base.engines import ServingEngine
from patchcraft.base.target import SglangTree

if TYPE_CHECKING:
    from patchcraft.analysis.vllm_draft_check import OneConfig, VllmDraftReport
    from patchcraft.base.vllm_tree import VllmTree
    from patchcraft.reading.draft_config import DraftConfig, TargetConfig
    from patchcraft.analysis.training import Training


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
    #: ``--engine``: ``sglang``, ``vllm`` or ``sglang,vllm`` (None: SGLang alone, the default).
    engines: str | None = None
    #: vLLM's tree: a path, or a fetched release (``patchcraft fetch --engine vllm VERSION``).
    vllm_target: str | None = None
    vllm_release: str | None = None
    #: The class vLLM serves (default: ``--model``, else the target's architecture).
    vllm_model: str | None = None
    #: vLLM: the platform and compilation judged (None: the tree's build platform, else every one; both modes).
    platform: str | None = None
    compilation: str | None = None


def check_draft_command(options: CheckDraftOptions) -> int:
    """Print the checks; exit 0 when they pass, 1 on a mismatch, 2 on bad input."""
    engines = parse_engines(options.engines)
    if ServingEngine.VLLM not in engines and (options.vllm_target or options.vllm_release or options.vllm_model):
        raise PatchcraftError("--vllm-target, --vllm-release and --vllm-model need --engine vllm or sglang,vllm")
    inputs = _inputs(options)
    # vLLM's tree first, then SGLang's: the order the two engines' input errors were always reported in.
    vllm = _vllm_tree(options, engines == (ServingEngine.VLLM,)) if ServingEngine.VLLM in engines else None
    if vllm is not None and not (options.vllm_model or inputs[4]):
        raise PatchcraftError("vLLM needs the model's class: pass --target (its config.json) or --vllm-model NAME")
    sglang_tree = (
        resolve_tree(options.target, options.release, options.overlay) if ServingEngine.SGLANG in engines else None
    )
    trees: list[SglangTree] = [t for t in (sglang_tree, vllm[0] if vllm else None) if t is not None]

    def compute() -> int:
        if vllm is not None:
            return _engines_command(options, engines, inputs, sglang_tree, vllm)
        assert sglang_tree is not None
        return _sglang_command(options, inputs, sglang_tree)

    return _remembered(options, trees, compute)


def _remembered(options: CheckDraftOptions, trees: list[SglangTree], compute: Callable[[], int]) -> int:
    """The verdict, replayed while nothing it read has changed (:mod:`patchcraft.engine.verdict_cache`)."""
    from patchcraft.engine import verdict_cache
    from patchcraft.engine.preflight_cache import Dependency

    trained_on = options.trained_on or ""
    report = trained_on[len("measured:") :] if trained_on.startswith("measured:") else None
    extra = [options.draft_dir, *(p for p in (options.target_model, report) if p)]

    def inputs() -> list[Dependency]:
        found = verdict_cache.draft_inputs(options.draft_dir, options.target_model, report)
        return found + [d for tree in trees for d in verdict_cache.tree_inputs(tree)]

    packages = [tree.package for tree in trees]
    roots: list[str | Path] = [*packages, *extra]
    return verdict_cache.answer("check-draft", options, trees, inputs, roots, compute)


def _sglang_command(options: CheckDraftOptions, inputs: _Inputs, tree: SglangTree) -> int:
    training, draft, target, num_layers, name = inputs
    report, _ = _sglang_report(options, tree, draft, target, training, num_layers, name)
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


# -- --engine: both engines ------------------------------------------------------------------------


def parse_engines(text: str | None) -> tuple[ServingEngine, ...]:
    """``sglang``, ``vllm``, ``sglang,vllm`` (either order, SGLang first in the output); None: SGLang alone."""
    if text is None:
        return (ServingEngine.SGLANG,)
    names = [part.strip() for part in text.split(",")]
    known = {e.value: e for e in ServingEngine}
    bad = [n for n in names if n not in known]
    if bad or not names or len(set(names)) != len(names):
        raise PatchcraftError(
            f"--engine {text}: expected sglang, vllm or sglang,vllm" + (f" ({bad[0]!r} is no engine)" if bad else "")
        )
    return tuple(e for e in ServingEngine if e.value in names)


def _engines_command(
    options: CheckDraftOptions,
    engines: tuple[ServingEngine, ...],
    inputs: _Inputs,
    sglang_tree: SglangTree | None,
    vllm: tuple[VllmTree, str | None],
) -> int:
    """Each asked engine's check of the same draft; exit 0 only when every one passes."""
    from patchcraft.analysis.draft_check import setter_modules
    from patchcraft.analysis.vllm_draft_check import check_vllm_draft, one_config

    training, draft, target, num_layers, name = inputs
    vllm_tree, vllm_release = vllm
    vllm_name = options.vllm_model or name
    if not vllm_name:
        raise PatchcraftError("vLLM needs the model's class: pass --target (its config.json) or --vllm-model NAME")
    sglang_report, model = None, None
    if sglang_tree is not None:
        sglang_report, model = _sglang_report(options, sglang_tree, draft, target, training, num_layers, name)
    modules = setter_modules(sglang_report.explanation) if sglang_report is not None else None
    vllm_report = check_vllm_draft(
        vllm_tree,
        vllm_name,
        draft,
        target,
        training,
        num_layers,
        options.tp,
        modules,
        platform=options.platform or vllm_tree.build_platform,
        compilation=options.compilation,
    )
    both = None
    if sglang_report is not None and model is not None and not (sglang_report.ok and vllm_report.ok):
        both = one_config(
            sglang_report,
            model,
            vllm_report,
            vllm_tree,
            vllm_name,
            training,
            num_layers,
            options.cuda_graph,
            options.tp,
            options.allreduce_fusion,
        )
    codes = {"sglang": verdict_code(sglang_report.ok) if sglang_report else None, "vllm": verdict_code(vllm_report.ok)}
    code = verdict_code(all(r.ok for r in (sglang_report, vllm_report) if r is not None))
    where = f"--release {vllm_release}" if vllm_release else str(vllm_tree.package)
    return console.print_report(
        options.output_format,
        code,
        lambda: documents.check_draft_engines_json(sglang_report, vllm_report, both, codes, where, code),
        lambda: engines_text(sglang_report, vllm_report, both, where),
    )


_Inputs = tuple["Training | None", "DraftConfig", "TargetConfig | None", int, "str | None"]


def _inputs(options: CheckDraftOptions) -> _Inputs:
    """What both engines' checks read: the training states, the draft, the target, its layer count, the model."""
    training = parse_training(options.trained_on) if options.trained_on else None
    if training is not None and training.deprecation:
        console.print_line(f"warning: {training.deprecation}")
    draft = read_draft(Path(options.draft_dir))
    target = read_target(Path(options.target_model)) if options.target_model else None
    num_layers = options.num_layers or (target.num_layers if target else None)
    if num_layers is None:
        raise PatchcraftError("the target's layer count is unknown: pass --target TARGET_MODEL_DIR or --num-layers N")
    name = options.model or (target.architectures[0] if target and target.architectures else None)
    return training, draft, target, num_layers, name


def _sglang_report(
    options: CheckDraftOptions,
    tree: SglangTree,
    draft: DraftConfig,
    target: TargetConfig | None,
    training: Training | None,
    num_layers: int,
    name: str | None,
) -> tuple[DraftReport, Model]:
    """SGLang's check of the draft on ``tree`` (TARGET, ``--release`` or ``--overlay``), and the model it read."""
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
    return report, model


def _vllm_tree(options: CheckDraftOptions, only_vllm: bool) -> tuple[VllmTree, str | None]:
    """vLLM's tree: --vllm-target or --vllm-release (with ``--engine vllm`` alone, TARGET or --release too)."""
    from patchcraft.commands.explain import resolve_vllm_tree

    target, release, overlay = options.vllm_target, options.vllm_release, None
    if only_vllm:
        if (target or release) and (options.target or options.release or options.overlay):
            raise PatchcraftError(
                "give vLLM's tree once: TARGET, --release or --overlay, or --vllm-target or --vllm-release"
            )
        target, release, overlay = target or options.target, release or options.release, options.overlay
    if target and release:
        raise PatchcraftError("give either --vllm-target or --vllm-release, not both")
    return resolve_vllm_tree(target, release, overlay), release


def engines_text(sglang: DraftReport | None, vllm: VllmDraftReport, both: OneConfig | None, vllm_where: str) -> str:
    """Each engine's report under its name, then the verdicts and the one config for both."""
    from patchcraft.ui.vllm_explain_text import vllm_report_text

    parts = []
    if sglang is not None:
        parts.append(f"== SGLang {sglang.explanation.version} ==\n" + report_text(sglang))
    parts.append(f"== vLLM {vllm.explanation.version} ==\n" + vllm_report_text(vllm, vllm_where))
    verdicts = []
    if sglang is not None:
        verdicts.append(f"SGLang {sglang.explanation.version} {'ok' if sglang.ok else 'mismatch'}")
    verdicts.append(f"vLLM {vllm.explanation.version} {'ok' if vllm.ok else 'mismatch'}")
    tail = [f"engines: {', '.join(verdicts)}"]
    if both is not None and sglang is not None:
        tail += one_config_lines(both, sglang, vllm, vllm_where)
    elif sglang is not None and not (sglang.ok and vllm.ok):
        stuck = [n for n, r in (("SGLang", sglang), ("vLLM", vllm)) if not r.ok and not r.fixes]
        tail.append(f"one config for both: none ({' and '.join(stuck)}: no fix passes the check)")
    return "\n".join(parts) + "\n" + "\n".join(tail) + "\n"


def one_config_lines(both: OneConfig, sglang: DraftReport, vllm: VllmDraftReport, vllm_where: str) -> list[str]:
    proof = "both checks run again on it: pass" if both.ok else f"run again on it, it fails: {both.why}"
    s_needs = "after `patchcraft apply`" if both.sglang_after_apply else "this install as it is"
    if both.sglang_flags:
        s_needs += ", serve with " + " and ".join(both.sglang_flags)
    v_needs = (
        f"after `patchcraft apply --engine vllm {vllm_where} --model {both.vllm_model}`"
        if both.vllm_after_apply
        else "this vLLM tree as it is"
    )
    s_ids = list(both.sglang_ids) if both.sglang_ids is not None else "none (the defaults)"
    v_ids = list(both.vllm_ids) if both.vllm_ids is not None else "as it is"
    return [
        f"one config for both engines ({proof}):",
        f"  eagle_config.eagle_aux_hidden_state_layer_ids = {s_ids}   SGLang {sglang.explanation.version}, {s_needs}",
        f"  eagle_aux_hidden_state_layer_ids = {v_ids} (top level)   vLLM {vllm.explanation.version}, {v_needs}",
    ]
