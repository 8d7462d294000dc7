"""``patchcraft run -- <server command>``: SGLang with the patches active, the install untouched.

Preflight (the draft checked against what this SGLang will feed it), then
the overlay (built, or reused when nothing changed), then ``exec`` of the
command with the overlay first on ``PYTHONPATH``: no wrapper process stays
in between, so exit codes and signals are the command's own.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from patchcraft import output
from patchcraft.commands._preflight import preflight, run_preflight
from patchcraft.errors import PatchcraftError
from patchcraft.report import OK
from patchcraft.server_args import ServerArgs, parse_server_args

#: Read by the preflight (commands/_preflight.py, patchcraft/server_args.py); kept importable from here.
__all__ = ["RunOptions", "ServerArgs", "parse_server_args", "preflight", "run_command", "overlay_build", "overlay_verify"]


@dataclass(frozen=True)
class RunOptions:
    command: tuple[str, ...]
    target: str | None = None
    overlay: str | None = None
    preflight: bool = True
    trained_on: str | None = None
    smoke: bool = True
    runner: bool = True


def run_command(options: RunOptions) -> int:
    """Preflight, overlay, exec. Returns only when the launch is refused (1) or for bad input (2)."""
    if not options.command:
        raise PatchcraftError("no command to run: patchcraft run [OPTIONS] -- COMMAND [ARGS...]")
    from patchcraft.overlay import build, stale
    from patchcraft.tree import resolve_target

    tree = resolve_target(options.target)
    if options.overlay:
        directory = Path(options.overlay)
        problems = stale(directory)
        if problems:
            raise PatchcraftError(f"{directory}: {problems[0]}: rebuild it with `patchcraft overlay build --out {directory}`")
        package = directory / "tree" / "sglang"
    else:
        from patchcraft.commands import _proof

        prove = _proof.gate("apply", options.smoke, quiet=True)
        overlay = build(tree, runner=options.runner, prove=prove)
        directory, package = overlay.directory, overlay.package
    if options.preflight:
        code = run_preflight(options.command, package, tree.package, options.trained_on, smoke=options.smoke and not options.overlay)
        if code != OK:
            return code
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(directory), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(options.command[0], list(options.command), env)
    except OSError as exc:
        raise PatchcraftError(f"cannot run {options.command[0]!r}: {exc.strerror or exc}") from None
    return OK  # not reached


def overlay_build(target: str | None, out: str | None, runner: bool, smoke: bool, output_format: str) -> int:
    """``patchcraft overlay build [TARGET] --out DIR``: write the overlay; print the PYTHONPATH line."""
    from patchcraft.commands import _proof
    from patchcraft.overlay import build
    from patchcraft.tree import resolve_target

    tree = resolve_target(target)
    overlay = build(tree, Path(out) if out else None, runner=runner, prove=_proof.gate("apply", smoke, quiet=True))
    if output_format == "json":
        output.print_json({"overlay": str(overlay.directory), "modules": list(overlay.modules), "reused": overlay.reused})
        return OK
    word = "reused" if overlay.reused else "built"
    output.print_line(f"overlay {word}: {len(overlay.modules)} patched modules of {tree.package} in {overlay.directory}")
    sys.stdout.write(f"PYTHONPATH={overlay.directory}\n")
    return OK


def overlay_verify(directory: str, target: str | None, output_format: str, color: str) -> int:
    """``patchcraft verify --overlay DIR``: the overlay matches the install and is fully patched."""
    from patchcraft.commands._pipeline import Options, run_pipeline
    from patchcraft.results import Mode
    from patchcraft.overlay import MANIFEST, stale

    path = Path(directory)
    problems = stale(path)
    if problems:
        raise PatchcraftError(f"{path}: {problems[0]}: rebuild it with `patchcraft overlay build --out {path}`")
    if target is not None:
        from patchcraft.tree import resolve_target

        built_from = json.loads((path / MANIFEST).read_text(encoding="utf-8"))["package"]
        if str(resolve_target(target).package.resolve()) != built_from:
            raise PatchcraftError(f"{path}: built from {built_from}, not {resolve_target(target).package}")
    return run_pipeline(Options(targets=(str(path / "tree" / "sglang"),), output_format=output_format, color=color), Mode.VERIFY)
