"""``patchcraft run -- <server command>``: SGLang with the patches active, the install untouched.

Preflight (the draft checked against what this SGLang will feed it), then
the overlay (built, or reused when nothing changed), then ``exec`` of the
command with the overlay first on ``PYTHONPATH``: no wrapper process stays
in between, so exit codes and signals are the command's own.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from patchcraft import output
from patchcraft.errors import PatchcraftError
from patchcraft.report import CHANGED, OK


@dataclass(frozen=True)
class RunOptions:
    command: tuple[str, ...]
    target: str | None = None
    overlay: str | None = None
    preflight: bool = True
    trained_on: str | None = None
    smoke: bool = True
    runner: bool = True


@dataclass(frozen=True)
class ServerArgs:
    """The flags of a server command line that the preflight reads (as SGLang's ServerArgs would)."""

    algorithm: str | None = None
    draft_path: str | None = None
    model_path: str | None = None
    tp: int = 1
    pp: int = 1


_FLAGS = {
    "--speculative-algorithm": "algorithm",
    "--speculative-draft-model-path": "draft_path",
    "--speculative-draft-model": "draft_path",
    "--model-path": "model_path",
    "--model": "model_path",
    "--tp-size": "tp",
    "--tp": "tp",
    "--tensor-parallel-size": "tp",
    "--pp-size": "pp",
    "--pp": "pp",
    "--pipeline-parallel-size": "pp",
}


def parse_server_args(argv: Sequence[str]) -> ServerArgs:
    """Read the flags from any command line that carries them (``--flag value`` or ``--flag=value``)."""
    found: dict[str, str] = {}
    args = list(argv)
    for index, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag not in _FLAGS:
            continue
        if not eq:
            if index + 1 >= len(args):
                continue
            value = args[index + 1]
        found[_FLAGS[flag]] = value
    values: dict = {}
    for key in ("algorithm", "draft_path", "model_path"):
        if key in found:
            values[key] = found[key]
    for key in ("tp", "pp"):
        if key in found:
            try:
                values[key] = int(found[key])
            except ValueError:
                raise PatchcraftError(f"the command's --{key}-size is {found[key]!r}, not a number") from None
    return ServerArgs(**values)


def run_command(options: RunOptions) -> int:
    """Preflight, overlay, exec. Returns only when the launch is refused (1) or for bad input (2)."""
    if not options.command:
        raise PatchcraftError("no command to run: patchcraft run [OPTIONS] -- COMMAND [ARGS...]")
    from patchcraft.tree import resolve_target

    tree = resolve_target(options.target)
    directory = _overlay_for_run(tree, options)
    package = directory / "tree" / "sglang"
    if options.preflight:
        code = preflight(parse_server_args(options.command), package, options.trained_on)
        if code != OK:
            return code
    env = dict(os.environ)
    # The version itself, not the link: the server and every worker it starts later see the same files.
    env["PYTHONPATH"] = os.pathsep.join([str(directory.resolve()), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(options.command[0], list(options.command), env)
    except OSError as exc:
        raise PatchcraftError(f"cannot run {options.command[0]!r}: {exc.strerror or exc}") from None
    return OK  # not reached


def _overlay_for_run(tree, options: RunOptions) -> Path:
    """The overlay the command gets: ``--overlay DIR`` checked (owned, intact, current), or the cache's, built or reused.

    Either way this process holds its lock, and the server inherits it:
    patchcraft never removes an overlay in use.
    """
    from patchcraft import overlay_check
    from patchcraft.overlay import build, hold

    if options.overlay:
        directory = Path(options.overlay)
        if not directory.exists():
            raise PatchcraftError(f"{directory}: no such overlay")
        hold(directory)  # before the checks, so that what was checked is what the server gets
        overlay_check.require_usable(directory)
        return directory
    from patchcraft.commands import _proof

    overlay = build(tree, runner=options.runner, prove=_proof.gate("apply", options.smoke, quiet=True), require_proof=options.smoke)
    _say_what_was_proven(overlay, options.smoke)
    if overlay.note:
        output.print_line(f"patchcraft run: {overlay.note}")
    return overlay.directory


def _say_what_was_proven(overlay, smoke: bool, prefix: str = "patchcraft run: ") -> None:
    """The "static, no torch" line, whether the overlay was just built or reused: never hidden."""
    from patchcraft.commands import _proof

    if smoke and overlay.proof == _proof.NO_TORCH:
        output.print_line(
            f"{prefix}torch is not installed, so the overlay is static: the harness did not run its patched code "
            "(pip install 'patchcraft[smoke]')"
        )


def preflight(server: ServerArgs, package: Path, trained_on: str | None) -> int:
    """check-draft for an EAGLE-3 launch, against the overlay's patched tree; 1 refuses the launch."""
    if (server.algorithm or "").upper() not in ("EAGLE3",):
        return OK
    if not server.draft_path:
        raise PatchcraftError("--speculative-algorithm EAGLE3 without --speculative-draft-model-path: nothing to check")
    draft_dir = Path(server.draft_path)
    if not draft_dir.is_dir():
        raise PatchcraftError(f"{draft_dir}: the draft model directory does not exist (only a local draft can be checked; --no-preflight skips it)")
    from patchcraft.draft import read_draft

    draft = read_draft(draft_dir)
    if server.pp > 1 and draft.layer_ids is not None and -1 in draft.layer_ids:
        output.print_line(
            f"patchcraft run: refused: the draft asks for layer id -1 (the embedding output) with --pp {server.pp}: "
            "the embedding exists only on the first pipeline stage; serve with one stage, or a draft without -1"
        )
        return CHANGED
    target = Path(server.model_path) if server.model_path and Path(server.model_path).is_dir() else None
    from patchcraft.commands.check_draft import CheckDraftOptions, check_draft_command

    if target is None:
        output.print_line("patchcraft run: warning: --model-path is not a local directory: the draft's ids are checked without the target's config")
        return OK
    options = CheckDraftOptions(str(draft_dir), target_model=str(target), target=str(package), trained_on=trained_on, tp=server.tp)
    code = check_draft_command(options)
    if code != OK:
        output.print_line("patchcraft run: refused to launch: the draft would be fed other hidden states than it was trained on (above); --no-preflight skips this check")
    return code


def overlay_build(target: str | None, out: str | None, runner: bool, smoke: bool, output_format: str) -> int:
    """``patchcraft overlay build [TARGET] --out DIR``: write the overlay; print the PYTHONPATH line."""
    from patchcraft.commands import _proof
    from patchcraft.overlay import build
    from patchcraft.tree import resolve_target

    tree = resolve_target(target)
    overlay = build(tree, Path(out) if out else None, runner=runner, prove=_proof.gate("apply", smoke, quiet=True), require_proof=smoke)
    if output_format == "json":
        output.print_json({"overlay": str(overlay.directory), "modules": list(overlay.modules), "reused": overlay.reused, "proof": overlay.proof})
        return OK
    _say_what_was_proven(overlay, smoke, "patchcraft overlay build: ")
    if overlay.note:
        output.print_line(f"patchcraft overlay build: {overlay.note}")
    word = "reused" if overlay.reused else "built"
    output.print_line(f"overlay {word}: {len(overlay.modules)} patched modules of {tree.package} in {overlay.directory} (proof: {overlay.proof})")
    sys.stdout.write(f"PYTHONPATH={overlay.directory}\n")
    return OK


def overlay_verify(directory: str, target: str | None, output_format: str, color: str, user: str | None = None) -> int:
    """``patchcraft verify --overlay DIR``: readable by the server, owned, intact, matches the install, fully patched."""
    from patchcraft import overlay_check
    from patchcraft.commands._pipeline import Options, run_pipeline
    from patchcraft.results import Mode

    path = Path(directory)
    overlay_check.require_usable(path)
    unreadable = overlay_check.unreadable(path, user)
    if unreadable:
        raise PatchcraftError(f"{path}: {unreadable[0]}: a server running as {user or 'another user'} would import the unpatched files")
    if target is not None:
        from patchcraft.tree import resolve_target

        built_from = overlay_check.read_manifest(path)["package"]
        if str(resolve_target(target).package.resolve()) != built_from:
            raise PatchcraftError(f"{path}: built from {built_from}, not {resolve_target(target).package}")
    return run_pipeline(Options(targets=(str(path / "tree" / "sglang"),), output_format=output_format, color=color), Mode.VERIFY)
