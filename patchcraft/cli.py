"""The thin click layer: parse flags once, dispatch, map errors to exit codes.

Every subcommand turns its flags into one options value (the pipeline's
:class:`~patchcraft.pipeline.stages.Options`, or its command's own)
and calls one function in ``patchcraft.commands`` that returns an
``int``. A :class:`PatchcraftError` prints one line and exits 2; Ctrl-C
exits 130; anything else is a bug and keeps its traceback (exit 3).

Here: the group, the entry point with that error policy, and the commands
that patch, serve, fetch and prune; the commands that check a draft
(explain, check-draft, probe) are :mod:`patchcraft.cli_drafts`'s, and the
options shared between commands :mod:`patchcraft.cli_options`'s.
"""

from __future__ import annotations

import sys
import traceback

import click

from patchcraft import __version__
from patchcraft.base.errors import BUG, INTERRUPTED, USAGE, PatchcraftError
from patchcraft.cli_drafts import check_draft, explain, probe
from patchcraft.cli_options import (
    choice,
    color_option,
    engine_option,
    format_option,
    overlay_option,
    patching_options,
    pipeline_options,
    serving_engine_option,
)
from patchcraft.commands._smoke_choices import Device, Engine
from patchcraft.ui.choices import REPORT_FORMATS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="patchcraft")
def cli() -> None:
    """Make SGLang EAGLE-3 accept layer id -1 (the embedding output), reliably.

    TARGET is a model file, an sglang package directory, a checkout root
    containing python/sglang, or nothing (the installed sglang, located
    without importing it). Exit codes: 0 clean or done, 1 would change or
    not verified, 2 usage or environment error.
    """


cli.add_command(explain)
cli.add_command(check_draft)
cli.add_command(probe)


@cli.command()
@serving_engine_option
@patching_options
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
        pipeline_options(targets, models, output_format, color, show_diff, release, no_runner),
        fail_on_change=fail_on_change,
        smoke=not no_smoke,
        replace_hand_edits=replace_hand_edits,
    )
    sys.exit(apply_command(options, check=check))


@cli.command()
@serving_engine_option
@patching_options
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
@overlay_option("Check the overlay in DIR instead: it matches the install (TARGET) and is fully patched.")
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
        pipeline_options(targets, models, output_format, color, release=release, no_runner=no_runner),
        smoke=not no_smoke,
    )
    if smoke_run:
        from patchcraft.commands.smoke import verify_smoke_command

        sys.exit(verify_smoke_command(options))
    from patchcraft.commands.verify import verify_command

    sys.exit(verify_command(options))


@cli.command()
@patching_options
@choice(
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
@choice(
    "--engine",
    Engine,
    Engine.SGLANG,
    help="cuda: sglang runs the GPU smoke test; harness runs the CPU harness's scenarios, a CUDA graph replay and torch.compile on the GPU (torch only). vllm: the tree is vLLM's (told from TARGET otherwise; cpu only): its patched setter and forward on the harness, as apply proves them.",
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
@overlay_option("cpu: run the harness on the files of the overlay in DIR (patchcraft overlay build).")
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
    from patchcraft.base.engines import ServingEngine

    serving = ServingEngine.VLLM if engine == Engine.VLLM else None
    options = pipeline_options(
        targets, models, output_format, color, release=release, no_runner=no_runner, engine=serving
    )
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
@serving_engine_option
@patching_options
def diff(targets, models, output_format, color, release, no_runner) -> None:
    """Print what apply would change, as a patch (git apply / patch -p1)."""
    from patchcraft.commands.diff import diff_command

    sys.exit(
        diff_command(pipeline_options(targets, models, output_format, color, release=release, no_runner=no_runner))
    )


@cli.command()
@serving_engine_option
@patching_options
def revert(targets, models, output_format, color, release, no_runner) -> None:
    """Remove exactly what patchcraft inserted."""
    from patchcraft.commands.revert import revert_command

    sys.exit(
        revert_command(pipeline_options(targets, models, output_format, color, release=release, no_runner=no_runner))
    )


@cli.command(name="list")
@click.argument("targets", nargs=-1, type=click.Path())
@format_option()
@click.option("--release", metavar="VERSION", help="Use the cached tree of VERSION (fetched on first use) as TARGET.")
@engine_option("The engine whose transforms are listed (default: told from TARGET; sglang without one).", detect=True)
def list_(targets, output_format, release, engine) -> None:
    """Show the transforms and which places they match in TARGET."""
    from patchcraft.commands._targets import release_targets
    from patchcraft.commands.list_ import list_command

    sys.exit(list_command(release_targets(targets, release, engine), output_format, engine))


@cli.command()
@click.argument("version")
@click.option(
    "--dest", type=click.Path(file_okay=False), help="Unpack into DEST/sglang (DEST/vllm) instead of the cache."
)
@engine_option("The release's engine (vllm: only the Python patchcraft reads is kept, not the wheel).")
def fetch(version, dest, engine) -> None:
    """Download SGLang (or vLLM) VERSION's source into the cache; print its package root."""
    from patchcraft.commands.fetch import fetch_command

    sys.exit(fetch_command(version, dest, engine))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--target", metavar="TARGET", help="The sglang (or vllm) the command imports (default: the installed one)."
)
@overlay_option("Use a prebuilt overlay (patchcraft overlay build --out DIR).")
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
@engine_option(
    "The engine the command serves (default: vllm for vllm serve / python -m vllm..., else from --target).", detect=True
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(target, overlay_dir, no_preflight, trained_on, no_smoke, no_runner, engine, command) -> None:
    """Run a server command with the patches active, the install untouched: patchcraft run -- python -m sglang.launch_server ... (or vllm serve ...)"""
    from patchcraft.commands.run import RunOptions, run_command

    options = RunOptions(
        tuple(command), target, overlay_dir, not no_preflight, trained_on, not no_smoke, not no_runner, engine
    )
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
@format_option()
def overlay_build(target, out, no_smoke, no_runner, output_format) -> None:
    """Write the overlay and its bootstrap; print the PYTHONPATH=DIR line to set (Dockerfile ENV, manifest)."""
    from patchcraft.commands.run import overlay_build_command

    sys.exit(overlay_build_command(target, out, not no_runner, not no_smoke, output_format))


@overlay.command(name="verify")
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("target", required=False, type=click.Path())
@format_option(REPORT_FORMATS)
@color_option()
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
@format_option()
def cache_prune(output_format) -> None:
    """Remove the cached overlays no process uses (and stale temp directories); never one in use."""
    from patchcraft.commands.prune import prune_command

    sys.exit(prune_command(output_format))


@cli.group(name="engine")
def engine_group() -> None:
    """The real engines on this machine's CPU: their environments, and the check that runs them (docs/real-engine.md)."""


@engine_group.command(name="env")
@click.option("--engine", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True, help="The engine.")
@click.option("--release", metavar="VERSION", help="The engine release (default: vllm 0.32.0, sglang 0.5.23).")
@click.option("--remove", is_flag=True, help="Remove the environment instead.")
def engine_env(engine, release, remove) -> None:
    """Build (or reuse) the engine release's environment in the cache; print its interpreter."""
    from patchcraft.commands.engine import engine_env_command

    sys.exit(engine_env_command(engine, release, remove))


@engine_group.command(name="check")
@click.option("--engine", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True, help="The engine.")
@click.option(
    "--release", metavar="VERSION", help="The engine release, its CPU build (default: vllm 0.32.0, sglang 0.5.23)."
)
@click.option("--model", default="LlamaForCausalLM", show_default=True, help="The target's architecture.")
@click.option("--layer-ids", default="0,2,3", show_default=True, help="The draft's ids (vLLM: id X is hs[X]).")
@click.option(
    "--num-layers", type=click.IntRange(min=2), default=6, show_default=True, help="The tiny target's layers."
)
@click.option(
    "--patched", is_flag=True, help="Run through `patchcraft run`: the overlay of the install, the install untouched."
)
@click.option(
    "--norm",
    type=click.Choice(["default", "inplace"]),
    default="default",
    show_default=True,
    help="inplace: force the in-place fused add-norm (what CUDA runs without compilation) on the CPU.",
)
@click.option("--compilation", type=click.Choice(["eager", "compiled"]), default="eager", show_default=True)
@click.option("--draft", metavar="DIR", type=click.Path(), help="Serve this (trained) draft instead of a random one.")
@click.option("--target", metavar="DIR", type=click.Path(), help="Serve this target (the one --draft was trained on).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=8, show_default=True, help="Tokens per prompt.")
@click.option("--prompts", metavar="FILE", type=click.Path(), help="The prompts: a JSON list of token-id lists.")
@click.option("--server", is_flag=True, help="vLLM's OpenAI server (its engine core in another process), over HTTP.")
@format_option()
def engine_check(**given) -> None:
    """Run the real engine on a tiny target: what its draft received, against explain's prediction."""
    from patchcraft.commands.engine import EngineCheckOptions, engine_check_command

    options = EngineCheckOptions(**given)
    sys.exit(engine_check_command(options))


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
