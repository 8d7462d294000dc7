"""``patchcraft smoke`` and ``patchcraft verify --smoke``: run the patched methods, judge the capture."""

from __future__ import annotations

from typing import Any, Callable

from patchcraft.ui import console, documents
from patchcraft.ui import machine_output
from patchcraft.ui.choices import DOCUMENT_FORMATS, OutputFormat
from patchcraft.commands._smoke_choices import Device, Engine
from patchcraft.pipeline import hand_review, proof as _proof
from patchcraft.pipeline.stages import Options, resolve_targets
from patchcraft.engine import hand_advice
from patchcraft.engine.tree_run import run
from patchcraft.engine.records import Mode, RunResult
from patchcraft.base.errors import PatchcraftError
from patchcraft.harness import require_torch


def smoke_command(
    options: Options,
    device: Device = Device.CPU,
    cuda: dict | None = None,
    engine: Engine = Engine.SGLANG,
    compiled: bool = False,
) -> int:
    """The CPU harness on every patched model class (``cuda``: the GPU smoke test instead).

    ``compiled``: the torch.compile check instead of the scenarios (patchcraft.harness.compiled).
    ``device=Device.CUDA, engine=Engine.HARNESS``: the harness on a CUDA device (patchcraft.harness.cuda).
    """
    if engine == Engine.VLLM or _names_vllm(options):
        if device != Device.CPU or compiled:
            raise PatchcraftError(
                "smoke on a vLLM tree runs its patched setter and forward on the CPU harness (--device cpu, "
                "without --compile); the GPU smoke test and torch.compile check are SGLang's"
            )
        return _verify_and_smoke(options, show_verify=False)
    if device != Device.CPU and engine == Engine.HARNESS:
        return _device_harness(options, device, compiled)
    if device == Device.CUDA:
        return _cuda(options, **(cuda or {}))
    return _verify_and_smoke(options, show_verify=False, compiled=compiled)


def _names_vllm(options: Options) -> bool:
    """Whether a TARGET is a vLLM tree (told from the path, nothing imported)."""
    from pathlib import Path

    from patchcraft.base.vllm_tree import is_vllm_path

    return any(is_vllm_path(Path(t)) for t in options.targets)


def verify_smoke_command(options: Options) -> int:
    """``verify``, then the CPU harness on every model class verify found patched."""
    return _verify_and_smoke(options, show_verify=True)


def _verify_and_smoke(options: Options, show_verify: bool, compiled: bool = False, device: Device = Device.CPU) -> int:
    require_torch()  # before any work: without torch this is one line, exit 2
    with console.progress(
        _progress_label(show_verify, compiled, device), shown=options.output_format != OutputFormat.JSON, unit="models"
    ) as status:
        status.update("importing torch")
        results, runs, label = _smoke_runs(options, compiled, device, on_row=status.update)
    if show_verify:
        results = [
            hand_review.advise(
                _proof.record(r, s, only=_proof.hand_fix_to_prove),
                hand_review.file_reports(r),
                hand_advice.Scope.of(options.models, options.runner, options.fusion),
            )
            for r, s in zip(results, runs)
        ]
    from patchcraft.harness import smoke_rows

    code = machine_output.exit_code(results, options.models, options.strict, smoke=runs)
    if options.output_format == OutputFormat.JSON:
        console.print_json(documents.smoke_json(results, runs, label, code, verify=show_verify))
        return code
    if show_verify:
        console.print_results(results, options.color)
    for line in smoke_rows.text_lines(runs, label):
        console.print_line(line)
    if options.output_format == OutputFormat.GITHUB:
        # verify's annotations too: they say why a model class was not run (not patched, unsupported).
        console.print_github(machine_output.github_lines(results, code) + smoke_rows.github_lines(runs))
    return code


def _progress_label(show_verify: bool, compiled: bool, device: Device) -> str:
    return (
        "verify --smoke"
        if show_verify
        else "smoke" + (f" --device {device}" if device != Device.CPU else "") + (" --compile" if compiled else "")
    )


def _smoke_runs(
    options: Options, compiled: bool, device: Device, on_row: Callable[[str, int, int], None]
) -> tuple[list[RunResult], list[Any], str]:
    """verify's results, the harness's runs (``on_row``: as each model class starts) and the label of what ran."""
    from patchcraft.harness.runner import smoke_model, smoke_tree

    results: list[RunResult] = [
        run(tree, Mode.VERIFY, options.models, runner=options.runner)
        for tree in resolve_targets(options.targets, options.engine)
    ]
    check: Callable[..., Any] = smoke_model
    if device != Device.CPU:
        from patchcraft.harness.cuda import device_check

        check = device_check(device.value, compiled)
        label = f"{device}, scenarios + graph replay" + (" + compile" if compiled else "")
    elif compiled:
        from patchcraft.harness.compiled import compiler

        check, label = compiler(), "cpu, torch.compile fullgraph"
    else:
        label = "cpu"
    # Hand-made models still missing edits run as apply would write them, and their verdicts are
    # their rows' proof, with what to do: verify --smoke, verify and apply say the same (pipeline/proof.py).
    runs = [
        _vllm_run(r)
        if r.tree.engine == "vllm"
        else smoke_tree(
            r.tree,
            options.models,
            models=[_proof.as_written(m) for m in r.models],
            texts=_proof.texts_of(r),
            check=check,
            on_row=on_row,
        )
        for r in results
    ]
    return results, runs, label


def _vllm_run(result: RunResult) -> Any:
    """vLLM's rows: the proof apply runs (patchcraft.harness.vllm_proof), on the tree as verify found it."""
    from patchcraft.harness.vllm_proof import prove_tree

    return prove_tree(result.tree, [_proof.as_written(m) for m in result.models], texts=_proof.texts_of(result))


def _device_harness(options: Options, device: Device, compiled: bool) -> int:
    """The CPU harness's scenarios, a graph capture and replay, and (``compiled``) torch.compile, on ``device``."""
    require_torch()
    from patchcraft.harness.cuda import require_device

    require_device(device.value)  # no CUDA here: one line, exit 2
    return _verify_and_smoke(options, show_verify=False, compiled=compiled, device=device)


def _cuda(
    options: Options,
    tp: int | None = None,
    model_path: str | None = None,
    draft_path: str | None = None,
    layer_ids: str | None = None,
    timeout: float | None = None,
    out: str | None = None,
    via_run: bool = False,
    mem_fraction_static: float | None = None,
) -> int:
    if options.targets:
        raise PatchcraftError("--device cuda tests the installed sglang; it takes no TARGET")
    try:
        from patchcraft.gpu_smoke.cuda_smoke import run_cuda_smoke
    except ImportError as exc:
        raise PatchcraftError(f"the CUDA smoke test is not available in this patchcraft ({exc})") from None
    given: dict = {
        "timeout_s": timeout,
        "out_dir": out,
        "via_run": via_run or None,
        "mem_fraction_static": mem_fraction_static,
    }
    return run_cuda_smoke(
        tp=tp,
        model_path=model_path,
        draft_path=draft_path,
        layer_ids=_cuda_layer_ids(layer_ids) if layer_ids else None,
        output_format=options.output_format if options.output_format in DOCUMENT_FORMATS else OutputFormat.TEXT,
        **{name: value for name, value in given.items() if value is not None},  # the defaults stay run_cuda_smoke's
    )


def _cuda_layer_ids(text: str) -> list[int] | None:
    """``--layer-ids`` for the tiny draft: the shared syntax; ids below -1 refused (``none``: the defaults)."""
    from patchcraft.harness.gpu_compare import expected_hs_indices
    from patchcraft.base.layer_ids import parse_layer_ids

    ids = parse_layer_ids(text)
    if ids is None:
        return None
    try:
        expected_hs_indices(ids)
    except ValueError as exc:
        raise PatchcraftError(f"--layer-ids {text!r}: {exc}") from None
    return list(ids)


def overlay_target(directory: str) -> str:
    """``smoke --overlay DIR``: the overlay's patched tree, once the overlay is safe to serve (else exit 2)."""
    from pathlib import Path

    from patchcraft.overlay import check

    return str(check.overlay_target(Path(directory)))
