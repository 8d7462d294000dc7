"""``patchcraft run -- <server command>``: SGLang (or vLLM) with the patches active, the install untouched.

Preflight (the draft checked against what this SGLang will feed it), then
the overlay (built, or reused when nothing changed), then ``exec`` of the
command with the overlay first on ``PYTHONPATH``: no wrapper process stays
in between, so exit codes and signals are the command's own.

A command that serves vLLM (``vllm serve``, ``python -m vllm.entrypoints...``:
:func:`patchcraft.reading.vllm_server_args.serves_vllm`), or ``--engine vllm``,
gets the overlay of the installed ``vllm`` (or ``--target``'s) through the
same pipeline, and the vLLM preflight (:mod:`patchcraft.commands._vllm_preflight`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from patchcraft.base.engines import ServingEngine
from patchcraft.ui import console, documents
from patchcraft.ui.choices import Color, OutputFormat
from patchcraft.ui.messages import no_torch_line
from patchcraft.commands._preflight import preflight, run_preflight
from patchcraft.base.errors import PatchcraftError
from patchcraft.ui.machine_output import OK
from patchcraft.reading.server_args import ServerArgs, parse_server_args

#: Read by the preflight (commands/_preflight.py, patchcraft/reading/server_args.py); kept importable from here.
__all__ = [
    "RunOptions",
    "ServerArgs",
    "parse_server_args",
    "preflight",
    "run_command",
    "overlay_build_command",
    "overlay_verify_command",
]


@dataclass(frozen=True)
class RunOptions:
    command: tuple[str, ...]
    target: str | None = None
    overlay: str | None = None
    preflight: bool = True
    trained_on: str | None = None
    smoke: bool = True
    runner: bool = True
    #: ``--engine``: None tells it from the command (a vLLM server is vLLM), then from ``--target``.
    engine: ServingEngine | None = None


def serving_engine(options: RunOptions) -> ServingEngine:
    """Whose install the command imports: ``--engine``; else vLLM for a vLLM server command; else from ``--target``."""
    from patchcraft.reading.vllm_server_args import serves_vllm

    if options.engine is not None:
        return options.engine
    if serves_vllm(options.command):
        return ServingEngine.VLLM
    if options.target is not None:
        from patchcraft.base.engines import detect_engine

        return detect_engine(options.target, None)
    return ServingEngine.SGLANG


def run_command(options: RunOptions) -> int:
    """Preflight, overlay, exec. Returns only when the launch is refused (1) or for bad input (2)."""
    if not options.command:
        raise PatchcraftError("no command to run: patchcraft run [OPTIONS] -- COMMAND [ARGS...]")
    from patchcraft.base.engines import resolve_engine_target

    engine = serving_engine(options)
    tree = resolve_engine_target(options.target or _command_package(options.command, engine), engine)
    directory, said_static = _overlay_for_run(tree, options)
    from patchcraft.overlay.build import package_dir

    package = package_dir(directory)
    if options.preflight:
        # The "static, no torch" line is said once: by the overlay's proof when it was just said, else by the preflight.
        smoke = options.smoke and not options.overlay and not said_static
        if engine is ServingEngine.VLLM:
            from patchcraft.commands._vllm_preflight import run_vllm_preflight

            code = run_vllm_preflight(options.command, package, options.trained_on)
        else:
            code = run_preflight(options.command, package, tree.package, options.trained_on, smoke=smoke)
        if code != OK:
            return code
    env = dict(os.environ)
    # The version itself, not the link: the server and every worker it starts later see the same files.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(directory.resolve()), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(options.command[0], list(options.command), env)
    except OSError as exc:
        raise PatchcraftError(f"cannot run {options.command[0]!r}: {exc.strerror or exc}") from None
    return OK  # not reached


def _command_package(command: tuple[str, ...], engine: ServingEngine) -> str | None:
    """The engine package the command's own Python imports (a venv's ``python``, its ``vllm`` script), when
    that Python is not this one: the overlay must be built from the files the server will import."""
    from patchcraft.base.engines import command_interpreter, package_of_interpreter

    interpreter = command_interpreter(command)
    if interpreter is None:
        return None
    found = package_of_interpreter(interpreter, engine)
    if found == "":
        raise PatchcraftError(
            f"{interpreter} (the command's Python) imports no {engine}: nothing to patch for it; pass --target"
        )
    return found or None


def _overlay_for_run(tree, options: RunOptions) -> tuple[Path, bool]:
    """The overlay the command gets: ``--overlay DIR`` checked (owned, intact, current), or the cache's, built or reused.

    Either way this process holds its lock, and the server inherits it:
    patchcraft never removes an overlay in use.
    """
    from patchcraft.overlay import check as overlay_check
    from patchcraft.overlay.build import hold

    if options.overlay:
        directory = Path(options.overlay)
        if not directory.exists():
            raise PatchcraftError(f"{directory}: no such overlay")
        hold(directory)  # before the checks, so that what was checked is what the server gets
        overlay_check.require_usable(directory)
        built_for = overlay_check.engine_of(directory)
        if built_for != tree.engine:
            raise PatchcraftError(f"{directory}: an overlay of {built_for}, but the command serves {tree.engine}")
        return directory, False
    from patchcraft.pipeline.serve import build_overlay

    overlay = build_overlay(tree, runner=options.runner, smoke=options.smoke, require_proof=options.smoke)
    said_static = _say_what_was_proven(overlay, options.smoke)
    if overlay.note:
        console.print_line(f"patchcraft run: {overlay.note}")
    return overlay.directory, said_static


def _say_what_was_proven(overlay, smoke: bool, prefix: str = "patchcraft run: ") -> bool:
    """The "static, no torch" line, whether the overlay was just built or reused: never hidden. True when said."""
    from patchcraft.base.status import Proof

    if not (smoke and overlay.proof == Proof.NO_TORCH):
        return False
    console.print_line(no_torch_line(prefix))
    return True


def overlay_build_command(
    target: str | None, out: str | None, runner: bool, smoke: bool, output_format: OutputFormat
) -> int:
    """``patchcraft overlay build [TARGET] --out DIR``: write the overlay; print the PYTHONPATH line."""
    from patchcraft.pipeline.serve import Refused, build_overlay
    from patchcraft.base.engines import detect_engine, resolve_engine_target

    tree = resolve_engine_target(target, detect_engine(target, None))
    try:
        overlay = build_overlay(tree, Path(out) if out else None, runner=runner, smoke=smoke, require_proof=smoke)
    except Refused as refused:
        if output_format != OutputFormat.JSON:  # the rows apply would print for this install, then the refusal
            console.print_hand_edits(refused.hand.reports, refused.hand.replaced, show_diff=False, color=Color.AUTO)
            console.print_results([refused.result], Color.AUTO)
        raise
    if output_format == OutputFormat.JSON:
        console.print_json(documents.overlay_json(overlay))
        return OK
    _say_what_was_proven(overlay, smoke, "patchcraft overlay build: ")
    if overlay.note:
        console.print_line(f"patchcraft overlay build: {overlay.note}")
    word = "reused" if overlay.reused else "built"
    console.print_line(
        f"overlay {word}: {len(overlay.modules)} patched modules of {tree.package} in {overlay.directory} (proof: {overlay.proof})"
    )
    sys.stdout.write(f"PYTHONPATH={overlay.directory}\n")
    return OK


def overlay_verify_command(
    directory: str, target: str | None, output_format: OutputFormat, color: Color, user: str | None = None
) -> int:
    """``patchcraft verify --overlay DIR``: readable by the server, owned, intact, matches the install, fully patched."""
    from patchcraft.overlay import check as overlay_check
    from patchcraft.commands._pipeline import run_pipeline
    from patchcraft.pipeline.stages import Options
    from patchcraft.engine.records import Mode

    path = Path(directory)
    overlay_check.require_usable(path)
    unreadable = overlay_check.unreadable(path, user)
    if unreadable:
        raise PatchcraftError(
            f"{path}: {unreadable[0]}: a server running as {user or 'another user'} would import the unpatched files"
        )
    if target is not None:
        from patchcraft.base.engines import detect_engine, resolve_engine_target

        built_from = overlay_check.read_manifest(path)["package"]
        tree = resolve_engine_target(target, detect_engine(target, None))
        if str(tree.package.resolve()) != built_from:
            raise PatchcraftError(f"{path}: built from {built_from}, not {tree.package}")
    from patchcraft.overlay.build import package_dir

    return run_pipeline(
        Options(targets=(str(package_dir(path)),), output_format=output_format, color=color), Mode.VERIFY
    )
