"""The thin click layer: parse flags once, dispatch, map errors to exit codes.

Every subcommand turns its flags into one options value (the pipeline's
:class:`~patchcraft.pipeline.stages.Options`, or its command's own)
and calls one function in ``patchcraft.commands`` that returns an
``int``. A :class:`PatchcraftError` prints one line and exits 2; Ctrl-C
exits 130; anything else is a bug and keeps its traceback (exit 3).
"""

from __future__ import annotations

import enum
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Type

import click

from patchcraft import __version__
from patchcraft.base.errors import BUG, INTERRUPTED, USAGE, PatchcraftError
from patchcraft.base.engines import ServingEngine
from patchcraft.commands._smoke_choices import Device, Engine
from patchcraft.ui.choices import DOCUMENT_FORMATS, REPORT_FORMATS, Color, OutputFormat

_JOBS = "patchcraft.jobs"
_STRICT = "patchcraft.strict"
_NO_FUSION = "patchcraft.no_fusion_fix"


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _choice(
    name: str,
    enum_type: Type[enum.Enum],
    default: enum.Enum,
    members: Optional[Iterable[enum.Enum]] = None,
    dest: Optional[str] = None,
    help: Optional[str] = None,
) -> Decorator:
    """An option whose value is one of ``enum_type``'s (``members``: some of them): the words as typed, the member passed on."""
    words = [m.value for m in (members if members is not None else enum_type)]

    def member(ctx: click.Context, param: click.Parameter, value: str) -> enum.Enum:
        return enum_type(value)

    names = (name, dest) if dest else (name,)
    return click.option(
        *names,
        type=click.Choice(words),
        default=default.value,
        show_default=True,
        callback=member,
        help=help,
    )


def _format(formats: Iterable[OutputFormat] = DOCUMENT_FORMATS, help: Optional[str] = None) -> Decorator:
    """``--format`` (``output_format``): text and json, and github where ``formats`` has it (docs/json.md)."""
    return _choice("--format", OutputFormat, OutputFormat.TEXT, formats, dest="output_format", help=help)


def _color(help: Optional[str] = None) -> Decorator:
    """``--color``: auto, always or never."""
    return _choice("--color", Color, Color.AUTO, help=help)


def _overlay(help: str) -> Decorator:
    """``--overlay DIR`` (``overlay_dir``): what an overlay directory stands for is each command's ``help``."""
    return click.option("--overlay", "overlay_dir", type=click.Path(file_okay=False), help=help)


def _engine(help: str, detect: bool = False) -> Decorator:
    """``--engine sglang|vllm`` (``engine``): the serving engine whose tree is read (docs/vllm.md).

    ``detect``: no default, the engine is told from TARGET or the installs
    (:func:`patchcraft.base.engines.detect_engine`); otherwise sglang.
    """
    if not detect:
        return _choice("--engine", ServingEngine, ServingEngine.SGLANG, help=help)

    def member(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[ServingEngine]:
        return ServingEngine(value) if value is not None else None

    return click.option(
        "--engine", type=click.Choice([m.value for m in ServingEngine]), default=None, callback=member, help=help
    )


#: ``--tp N`` of explain and check-draft: the server's tensor parallelism.
_tp = click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="The server's --tp-size (at TP > 1, all-reduce fusion can leave captured states partial).",
)


#: ``--no-allreduce-fusion`` of explain and check-draft: the server turns FlashInfer's all-reduce fusion off.
_no_allreduce_fusion = click.option(
    "--no-allreduce-fusion",
    "no_allreduce_fusion",
    is_flag=True,
    help="The server runs with --enforce-disable-flashinfer-allreduce-fusion: at TP > 1 every layer reduces before a "
    "capture (no partial sums), and every layer loses the fused kernel.",
)


def _common(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.argument("targets", nargs=-1, type=click.Path())(func)
    func = click.option(
        "--model", "models", multiple=True, metavar="NAME", help="Only this model (file stem or class); repeatable."
    )(func)
    func = _format(REPORT_FORMATS, help="Report format (github: workflow annotations).")(func)
    func = _color(help="Colour; NO_COLOR is honoured.")(func)
    func = click.option(
        "--release",
        metavar="VERSION",
        help="Use SGLang VERSION from the cache (fetched on first use) instead of TARGET.",
    )(func)
    func = click.option(
        "--no-runner",
        "no_runner",
        is_flag=True,
        help="Leave srt/model_executor/ alone (no CUDA graphs: the runner fix is not needed).",
    )(func)
    # Not parameters of each command: _options reads them from the context.
    func = click.option(
        "--no-fusion-fix",
        "no_fusion_fix",
        is_flag=True,
        expose_value=False,
        callback=_remember_no_fusion,
        help="Leave srt/layers/communicator.py alone (the allreduce-fusion row: TP 1, or fusion disabled when serving).",
    )(func)
    func = click.option(
        "--jobs",
        "-j",
        type=click.IntRange(min=1),
        metavar="N",
        expose_value=False,
        callback=_remember_jobs,
        help="Patch N files at once (default: one per core).",
    )(func)
    func = click.option(
        "--strict",
        is_flag=True,
        expose_value=False,
        callback=_remember_strict,
        help="Unsupported models fail the run (as when named with --model).",
    )(func)
    return func


def _remember_jobs(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    ctx.meta[_JOBS] = value


def _remember_no_fusion(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    ctx.meta[_NO_FUSION] = value


def _remember_strict(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    ctx.meta[_STRICT] = value


def _options(targets, models, output_format, color, show_diff=False, release=None, no_runner=False):
    from patchcraft.pipeline.stages import Options
    from patchcraft.commands._targets import release_targets

    meta = click.get_current_context().meta
    return Options(
        targets=release_targets(targets, release),
        models=tuple(models),
        output_format=output_format,
        color=color,
        show_diff=show_diff,
        runner=not no_runner,
        fusion=not meta.get(_NO_FUSION),
        jobs=meta.get(_JOBS),
        strict=bool(meta.get(_STRICT)),
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="patchcraft")
def cli() -> None:
    """Make SGLang EAGLE-3 accept layer id -1 (the embedding output), reliably.

    TARGET is a model file, an sglang package directory, a checkout root
    containing python/sglang, or nothing (the installed sglang, located
    without importing it). Exit codes: 0 clean or done, 1 would change or
    not verified, 2 usage or environment error.
    """


@cli.command()
@_common
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if anything would change.")
@click.option("--diff", "show_diff", is_flag=True, help="Also print the unified diff.")
@click.option(
    "--exit-non-zero-on-fix",
    "fail_on_change",
    is_flag=True,
    help="Exit 1 when a file was rewritten (as formatters do under pre-commit).",
)
@click.option(
    "--no-smoke", "no_smoke", is_flag=True, help="Do not run the CPU harness on the patched code before writing it."
)
@click.option(
    "--replace-hand-edits",
    "replace_hand_edits",
    is_flag=True,
    help="Patch the pristine text (RECORD + wheel, the cached release's wheel, or git HEAD) of files edited by hand at patchcraft's edit sites only; refuse files with other hand edits.",
)
def apply(
    targets,
    models,
    output_format,
    color,
    release,
    no_runner,
    check,
    show_diff,
    fail_on_change,
    no_smoke,
    replace_hand_edits,
) -> None:
    """Patch the model files in place (idempotent, atomic; proven by the CPU harness first when torch is installed)."""
    from dataclasses import replace

    from patchcraft.commands.apply import apply_command

    options = replace(
        _options(targets, models, output_format, color, show_diff, release, no_runner),
        fail_on_change=fail_on_change,
        smoke=not no_smoke,
        replace_hand_edits=replace_hand_edits,
    )
    sys.exit(apply_command(options, check=check))


@cli.command()
@_common
@click.option(
    "--smoke",
    "smoke_run",
    is_flag=True,
    help="Also run the patched methods on CPU stand-ins (needs patchcraft[smoke]).",
)
@click.option(
    "--no-smoke",
    "no_smoke",
    is_flag=True,
    help="Do not run the CPU harness on hand-made edits (it runs when torch is installed).",
)
@_overlay("Check the overlay in DIR instead: it matches the install (TARGET) and is fully patched.")
@click.option(
    "--user",
    "user",
    metavar="NAME",
    help="With --overlay: check that user NAME (the server's) can read it, its parent directories included.",
)
def verify(targets, models, output_format, color, release, no_runner, smoke_run, no_smoke, overlay_dir, user) -> None:
    """Check each edit is present and correct; write nothing."""
    from dataclasses import replace

    if overlay_dir:
        from patchcraft.commands.run import overlay_verify_command

        if len(targets) > 1:
            raise click.UsageError("--overlay checks one install: give at most one TARGET")
        sys.exit(overlay_verify_command(overlay_dir, targets[0] if targets else None, output_format, color, user))

    options = replace(
        _options(targets, models, output_format, color, release=release, no_runner=no_runner), smoke=not no_smoke
    )
    if smoke_run:
        from patchcraft.commands.smoke import verify_smoke_command

        sys.exit(verify_smoke_command(options))
    from patchcraft.commands.verify import verify_command

    sys.exit(verify_command(options))


@cli.command()
@_common
@_choice(
    "--device",
    Device,
    Device.CPU,
    help="cpu: the patched methods on stand-ins (needs patchcraft[smoke]); cuda: the GPU smoke test.",
)
@click.option(
    "--tp", type=click.IntRange(1, 8), default=None, help="cuda: tensor-parallel size (default: all visible GPUs)."
)
@click.option(
    "--model-path",
    type=click.Path(exists=True, file_okay=False),
    help="cuda: target checkpoint (default: a tiny random DeepSeek-V3).",
)
@click.option(
    "--draft-path",
    type=click.Path(exists=True, file_okay=False),
    help="cuda: EAGLE-3 draft (default: a tiny random one).",
)
@click.option("--layer-ids", metavar="IDS", help="cuda: aux layer ids for the tiny draft, e.g. -1,1,2.")
@_choice(
    "--engine",
    Engine,
    Engine.SGLANG,
    help="cuda: sglang runs the GPU smoke test; harness runs the CPU harness's scenarios, a CUDA graph replay and torch.compile on the GPU (torch only).",
)
@click.option(
    "--compile",
    "compiled",
    is_flag=True,
    help="Compile each patched forward with torch.compile(fullgraph=True) (cpu: instead of the scenarios; --engine harness: as well); fail on a graph break the original does not have.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=None,
    metavar="SECONDS",
    help="cuda (sglang): the time bound per engine (default 200).",
)
@click.option(
    "--out", type=click.Path(file_okay=False), help="cuda (sglang): write spec.log, base.log and summary.json to DIR."
)
@click.option(
    "--via-run",
    "via_run",
    is_flag=True,
    help="cuda (sglang): leave the install unpatched; the EAGLE-3 engine gets the patch from an overlay, through patchcraft run.",
)
@click.option(
    "--mem-fraction-static",
    "mem_fraction_static",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    metavar="F",
    help="cuda (sglang): SGLang's mem_fraction_static (default 0.3 for small targets, 0.85 for real ones).",
)
@_overlay("cpu: run the harness on the files of the overlay in DIR (patchcraft overlay build).")
def smoke(
    targets,
    models,
    output_format,
    color,
    release,
    no_runner,
    device,
    tp,
    model_path,
    draft_path,
    layer_ids,
    engine,
    compiled,
    timeout,
    out,
    via_run,
    mem_fraction_static,
    overlay_dir,
) -> None:
    """Run the real patched methods on tiny tensors; check they capture the right states."""
    from patchcraft.commands.smoke import smoke_command

    if overlay_dir:
        if targets or release:
            raise click.UsageError("--overlay is the target: give no TARGET or --release with it")
        from patchcraft.commands.smoke import overlay_target

        targets = (overlay_target(overlay_dir),)
    options = _options(targets, models, output_format, color, release=release, no_runner=no_runner)
    cuda = dict(
        tp=tp,
        model_path=model_path,
        draft_path=draft_path,
        layer_ids=layer_ids,
        timeout=timeout,
        out=out,
        via_run=via_run,
        mem_fraction_static=mem_fraction_static,
    )
    sys.exit(smoke_command(options, device=device, cuda=cuda, engine=engine, compiled=compiled))


@cli.command()
@_common
def diff(targets, models, output_format, color, release, no_runner) -> None:
    """Print what apply would change, as a patch (git apply / patch -p1)."""
    from patchcraft.commands.diff import diff_command

    sys.exit(diff_command(_options(targets, models, output_format, color, release=release, no_runner=no_runner)))


@cli.command()
@_common
def revert(targets, models, output_format, color, release, no_runner) -> None:
    """Remove exactly what patchcraft inserted."""
    from patchcraft.commands.revert import revert_command

    sys.exit(revert_command(_options(targets, models, output_format, color, release=release, no_runner=no_runner)))


@cli.command(name="list")
@click.argument("targets", nargs=-1, type=click.Path())
@_format()
def list_(targets, output_format) -> None:
    """Show the transforms and which places they match in TARGET."""
    from patchcraft.commands.list_ import list_command

    sys.exit(list_command(tuple(targets), output_format))


@cli.command()
@click.argument("version")
@click.option(
    "--dest", type=click.Path(file_okay=False), help="Unpack into DEST/sglang (DEST/vllm) instead of the cache."
)
@_engine("The release's engine (vllm: only the Python patchcraft reads is kept, not the wheel).")
def fetch(version, dest, engine) -> None:
    """Download SGLang (or vLLM) VERSION's source into the cache; print its package root."""
    from patchcraft.commands.fetch import fetch_command

    sys.exit(fetch_command(version, dest, engine))


@cli.command()
@click.argument("target", required=False, type=click.Path())
@click.option(
    "--layer-ids",
    required=True,
    metavar="IDS",
    help="Comma-separated aux layer ids, e.g. -1,2,30 (none: the defaults).",
)
@click.option("--num-layers", required=True, type=int, help="The target's num_hidden_layers.")
@click.option("--model", metavar="NAME", help="Model file stem or class, e.g. deepseek_v2.")
@click.option("--release", metavar="VERSION", help="Use SGLang VERSION from the cache instead of TARGET.")
@_format()
@_tp
@_no_allreduce_fusion
@_overlay("Explain the overlay in DIR: the files `patchcraft run` serves.")
@_engine(
    "The server: sglang or vllm (default: told from TARGET, else the installed one; --release means sglang).",
    detect=True,
)
def explain(
    target, layer_ids, num_layers, model, release, output_format, tp, no_allreduce_fusion, overlay_dir, engine
) -> None:
    """Show which hidden states these aux layer ids capture on this install."""
    from patchcraft.commands.explain import ExplainOptions, explain_command

    sys.exit(
        explain_command(
            ExplainOptions(
                layer_ids,
                num_layers,
                target,
                release,
                model,
                output_format,
                tp=tp,
                overlay=overlay_dir,
                engine=engine,
                allreduce_fusion=not no_allreduce_fusion,
            )
        )
    )


@cli.command(name="check-draft")
@click.argument("draft_dir", type=click.Path())
@click.argument("target", required=False, type=click.Path())
@click.option(
    "--target", "target_model", metavar="DIR", type=click.Path(), help="The target model's directory (its config.json)."
)
@click.option(
    "--trained-on",
    metavar="CONV",
    help="How the draft was trained: hf:0,3,31 (HF hidden_states indices), specforge, specforge@<SGLang release>, speculators, speculators@0.4, eagle, modelopt, modelopt@vllm-dump, torchspec, torchspec@vllm-ebf869e, angelslim or automodel (docs/layer-ids.md).",
)
@click.option("--model", metavar="NAME", help="Model file stem or class (default: the target's architecture).")
@click.option("--num-layers", type=int, help="The target's num_hidden_layers (default: from --target).")
@click.option("--release", metavar="VERSION", help="Use SGLang VERSION from the cache instead of TARGET.")
@click.option("--no-cuda-graph", "no_cuda_graph", is_flag=True, help="The server runs with --disable-cuda-graph.")
@_format()
@_tp
@_no_allreduce_fusion
@_overlay("Check against the overlay in DIR: the files `patchcraft run` serves.")
def check_draft(
    draft_dir,
    target,
    target_model,
    trained_on,
    model,
    num_layers,
    release,
    no_cuda_graph,
    output_format,
    tp,
    no_allreduce_fusion,
    overlay_dir,
) -> None:
    """Check a draft's aux layer ids and fc width against this install and target."""
    from patchcraft.commands.check_draft import CheckDraftOptions, check_draft_command

    options = CheckDraftOptions(
        draft_dir,
        target_model,
        target,
        release,
        model,
        num_layers,
        trained_on,
        not no_cuda_graph,
        output_format,
        tp=tp,
        overlay=overlay_dir,
        allreduce_fusion=not no_allreduce_fusion,
    )
    sys.exit(check_draft_command(options))


@cli.command()
@click.argument("draft_dir", type=click.Path())
@click.argument("target", required=False, type=click.Path())
@click.option(
    "--data",
    required=True,
    metavar="PATH",
    type=click.Path(),
    help="The training dump: a file or a directory (docs/probe.md).",
)
@click.option(
    "--states",
    metavar="hf:I,J,...",
    help="The HF indices of the dump's states, in stored order (speculators, SpecForge).",
)
@click.option(
    "--target",
    "target_model",
    metavar="DIR",
    type=click.Path(),
    help="The target model's directory: its config.json, and its embedding when the draft has none.",
)
@click.option("--served", metavar="hf:I,J,K", help="Compare with this wiring instead of the one this install serves.")
@click.option("--model", metavar="NAME", help="Model file stem or class (default: the target's architecture).")
@click.option("--num-layers", type=int, help="The target's num_hidden_layers (default: from --target).")
@click.option(
    "--release", metavar="VERSION", help="Run SGLang VERSION's draft code from the cache instead of TARGET's."
)
@click.option("--tokens", type=click.IntRange(min=1), default=512, show_default=True, help="Positions scored.")
@click.option(
    "--top-k", "top_k", type=click.IntRange(min=1), default=4, show_default=True, help="k of the top-k accuracy."
)
@click.option(
    "--report",
    metavar="FILE",
    type=click.Path(),
    help="Also write the JSON report to FILE (check-draft --trained-on measured:FILE).",
)
@_format()
@_overlay("Run the draft code of the overlay in DIR.")
def probe(
    draft_dir,
    target,
    data,
    states,
    target_model,
    served,
    model,
    num_layers,
    release,
    tokens,
    top_k,
    report,
    output_format,
    overlay_dir,
) -> None:
    """Measure which hidden states a draft's weights expect: run its first step on its training states."""
    from patchcraft.commands.probe import ProbeOptions, probe_command

    options = ProbeOptions(
        draft_dir,
        data,
        target,
        release,
        overlay_dir,
        target_model,
        states,
        served,
        model,
        num_layers,
        tokens,
        top_k,
        output_format,
        report,
    )
    sys.exit(probe_command(options))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--target", metavar="TARGET", help="The sglang the command imports (default: the installed one).")
@_overlay("Use a prebuilt overlay (patchcraft overlay build --out DIR).")
@click.option(
    "--no-preflight",
    "no_preflight",
    is_flag=True,
    help="Launch without checking the draft against what this SGLang feeds it.",
)
@click.option(
    "--trained-on",
    metavar="CONV",
    help="The draft's training convention, as for check-draft (hf:0,3,31, specforge, speculators, eagle, ...).",
)
@click.option("--no-smoke", "no_smoke", is_flag=True, help="Build the overlay without running the CPU harness on it.")
@click.option("--no-runner", "no_runner", is_flag=True, help="Leave srt/model_executor/ out of the overlay.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(target, overlay_dir, no_preflight, trained_on, no_smoke, no_runner, command) -> None:
    """Run a server command with the patches active, the install untouched: patchcraft run -- python -m sglang.launch_server ..."""
    from patchcraft.commands.run import RunOptions, run_command

    options = RunOptions(tuple(command), target, overlay_dir, not no_preflight, trained_on, not no_smoke, not no_runner)
    sys.exit(run_command(options))


@cli.group()
def overlay() -> None:
    """Patched SGLang files served at import time (for images and read-only installs)."""


@overlay.command(name="build")
@click.argument("target", required=False, type=click.Path())
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Write the overlay to DIR (default: a directory in the cache, keyed by the install).",
)
@click.option("--no-smoke", "no_smoke", is_flag=True, help="Do not run the CPU harness on the patched files.")
@click.option("--no-runner", "no_runner", is_flag=True, help="Leave srt/model_executor/ out of the overlay.")
@_format()
def overlay_build(target, out, no_smoke, no_runner, output_format) -> None:
    """Write the overlay and its bootstrap; print the PYTHONPATH=DIR line to set (Dockerfile ENV, manifest)."""
    from patchcraft.commands.run import overlay_build_command

    sys.exit(overlay_build_command(target, out, not no_runner, not no_smoke, output_format))


@overlay.command(name="verify")
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("target", required=False, type=click.Path())
@_format(REPORT_FORMATS)
@_color()
@click.option(
    "--user",
    "user",
    metavar="NAME",
    help="Check that user NAME (the server's) can read it, its parent directories included.",
)
def overlay_verify(directory, target, output_format, color, user) -> None:
    """Check that an overlay matches the install it was built from and is fully patched."""
    from patchcraft.commands.run import overlay_verify_command

    sys.exit(overlay_verify_command(directory, target, output_format, color, user))


@cli.group(name="cache")
def cache_group() -> None:
    """patchcraft's cache (overlays, fetched releases, run results)."""


@cache_group.command(name="prune")
@_format()
def cache_prune(output_format) -> None:
    """Remove the cached overlays no process uses (and stale temp directories); never one in use."""
    from patchcraft.commands.prune import prune_command

    sys.exit(prune_command(output_format))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point with the error policy."""
    if argv is None:
        _skip_final_collection()
    try:
        code = cli.main(args=argv, prog_name="patchcraft", standalone_mode=False)
    except PatchcraftError as exc:
        sys.stderr.write(f"patchcraft: error: {exc}\n")
        sys.exit(USAGE)
    except click.exceptions.Abort:
        sys.stderr.write("patchcraft: interrupted\n")
        sys.exit(INTERRUPTED)
    except KeyboardInterrupt:
        sys.stderr.write("patchcraft: interrupted\n")
        sys.exit(INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # the reader of our output went away (`| head`)
        sys.exit(1)
    except SystemExit:
        raise
    except Exception:  # a bug: keep the traceback, distinct exit code
        traceback.print_exc()
        sys.stderr.write("patchcraft: internal error (a bug); please report it with the traceback above\n")
        sys.exit(BUG)
    sys.exit(code or 0)


def _skip_final_collection() -> None:
    """Spare a command's process the garbage collector's full scans.

    A run leaves millions of long-lived objects (``ast`` and libcst trees)
    that the process keeps to its end. The engine already runs with the
    cyclic collector paused; once it returns, the first collections (and the
    one Python runs at interpreter exit) would rescan all of them for cycles
    there are none of: ~0.2 s of a single-file verify. A command is a short
    process, so the collector stays off for all of it, and what is alive at
    exit is frozen out of the last scan (still freed as usual). Only for the
    process entry point (``argv`` None), never for in-process callers that
    run on afterwards.
    """
    import atexit
    import gc

    gc.disable()
    atexit.register(gc.freeze)
