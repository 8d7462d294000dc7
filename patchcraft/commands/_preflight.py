"""``patchcraft run``'s preflight: the draft checked against what this SGLang will feed it, before exec.

The command line is read as the release's ``ServerArgs`` reads it
(:mod:`patchcraft.reading.server_args`: its own flags and abbreviations,
``--config FILE``); a hub name is looked up in the local Hugging Face cache
(:mod:`patchcraft.reading.hub_cache`). Whatever cannot be read is named, and the
launch is refused (exit 2) rather than passed on an unchecked "ok";
``--no-preflight`` is the explicit way out. An ok verdict is cached
(:mod:`patchcraft.engine.preflight_cache`) and replayed while nothing it read changes.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from patchcraft.ui import console
from patchcraft.ui import messages
from patchcraft.engine import preflight_cache
from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.hub_cache import find_snapshot, looks_like_repo_id
from patchcraft.engine.preflight_cache import Dependency, InputKind
from patchcraft.ui.machine_output import CHANGED, OK
from patchcraft.reading.server_args import ARG_GROUPS, ServerArgs, flag_files, parse_server_args

PREFIX = "patchcraft run: "
WAY_OUT = "--no-preflight launches without the check"


@dataclass(frozen=True)
class Prepared:
    """A check ready to run: its check-draft options, and every input it will read."""

    options: Any  # CheckDraftOptions (imported late: check_draft pulls in the explain machinery)
    inputs: tuple[Dependency, ...]
    #: How the command line was read (abbreviations, --config, hub snapshots), printed with the check.
    notes: tuple[str, ...] = ()


def run_preflight(argv: Sequence[str], package: Path, install: Path, trained_on: str | None, smoke: bool = True) -> int:
    """The preflight of ``argv`` against the patched tree ``package`` of ``install``; a stored ok is replayed."""
    if smoke and not preflight_cache.torch_importable():
        console.print_line(messages.no_torch_line(PREFIX))
    lookup = preflight_cache.key(argv, package, install, trained_on)
    hit = preflight_cache.load(lookup)
    if hit is not None:
        _replay(hit)
        return OK
    with _captured() as (out, err):
        server = parse_server_args(argv, install)
        prepared = prepare(server, package, trained_on)
        inputs = command_inputs(argv, install) + list(prepared.inputs if isinstance(prepared, Prepared) else ())
        if isinstance(prepared, Prepared):
            inputs += preflight_cache.tree_dependencies(package)
        recorded = preflight_cache.record(inputs)
        code = check(prepared) if isinstance(prepared, Prepared) else prepared
    if code == OK:
        preflight_cache.store(lookup, recorded, out.getvalue(), err.getvalue())
    return code


def command_inputs(argv: Sequence[str], install: Path) -> list[Dependency]:
    """What reading the command line reads: the release's flag files, and the ``--config`` file."""
    inputs = [Dependency(InputKind.FILE, path) for path in flag_files(install)]
    inputs.append(Dependency(InputKind.LISTING, install / ARG_GROUPS))
    inputs.append(Dependency(InputKind.FILE, install / "srt" / "server_args.py"))
    args = list(argv)
    if "--config" in args and args.index("--config") + 1 < len(args):
        inputs.append(Dependency(InputKind.FILE, Path(args[args.index("--config") + 1])))
    return inputs


def preflight(server: ServerArgs, package: Path, trained_on: str | None) -> int:
    """check-draft for an EAGLE-3 launch, against the overlay's patched tree; 1 refuses the launch."""
    prepared = prepare(server, package, trained_on)
    return check(prepared) if isinstance(prepared, Prepared) else prepared


def prepare(server: ServerArgs, package: Path, trained_on: str | None) -> Prepared | int:
    """Everything before check-draft runs: an exit code when the launch is decided already, else the check."""
    if "algorithm" in server.unchecked:
        raise PatchcraftError(f"preflight not checked: {server.unchecked['algorithm']}; {WAY_OUT}")
    if (server.algorithm or "").upper() != "EAGLE3":
        return OK
    for why in server.unchecked.values():
        raise PatchcraftError(f"preflight not checked: {why}; {WAY_OUT}")
    if not server.draft_path:
        raise PatchcraftError("--speculative-algorithm EAGLE3 without --speculative-draft-model-path: nothing to check")
    inputs: list[Dependency] = []
    notes = list(server.notes)
    draft_dir = _local_model(server.draft_path, server.draft_revision, "--speculative-draft-model-path", inputs, notes)
    inputs += preflight_cache.draft_dependencies(draft_dir)
    from patchcraft.analysis.draft_check import convention_known
    from patchcraft.reading.draft_config import read_draft

    draft = read_draft(draft_dir)
    if server.pp > 1 and draft.layer_ids is not None and -1 in draft.layer_ids:
        console.print_line(
            f"{PREFIX}refused: the draft asks for layer id -1 (the embedding output) with --pp {server.pp}: "
            "the embedding exists only on the first pipeline stage; serve with one stage, or a draft without -1"
        )
        return CHANGED
    if trained_on is None and not convention_known(draft):
        console.print_line(
            f"{PREFIX}refused: how the draft was trained is not known, so the states it will be fed cannot be checked "
            "against the states it was trained on: pass --trained-on (hf:I,J,K, specforge, speculators, eagle: "
            "docs/layer-ids.md), or --no-preflight to launch unchecked"
        )
        return CHANGED
    if not server.model_path:
        raise PatchcraftError(
            f"preflight not checked: the command has no --model-path, so the draft was not checked against a target; {WAY_OUT}"
        )
    target = _local_model(server.model_path, server.revision, "--model-path", inputs, notes)
    inputs.append(Dependency(InputKind.FILE, target / "config.json"))
    from patchcraft.commands.check_draft import CheckDraftOptions

    options = CheckDraftOptions(
        str(draft_dir),
        target_model=str(target),
        target=str(package),
        trained_on=trained_on,
        tp=server.tp,
        allreduce_fusion=server.allreduce_fusion,  # the command's --enforce-disable-flashinfer-allreduce-fusion
    )
    return Prepared(options, tuple(inputs), tuple(notes))


def check(prepared: Prepared) -> int:
    """Run check-draft; a mismatch refuses the launch (1)."""
    from patchcraft.commands.check_draft import check_draft_command

    for note in prepared.notes:
        console.print_line(PREFIX + note)
    code = check_draft_command(prepared.options)
    if code != OK:
        console.print_line(
            f"{PREFIX}refused to launch: the draft would be fed other hidden states than it was trained on (above); {WAY_OUT}"
        )
    return code


def _local_model(value: str, revision: str | None, flag: str, inputs: list[Dependency], notes: list[str]) -> Path:
    """A local model directory for ``value``: the directory itself, or a hub name's cached snapshot."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path
    if not looks_like_repo_id(value):
        role = "draft model" if "draft" in flag else "target model"
        raise PatchcraftError(
            f"{path}: the {role} directory does not exist (only a local or cached model can be checked; {WAY_OUT})"
        )
    snapshot = find_snapshot(value, revision)
    inputs.append(Dependency(InputKind.FILE, snapshot.ref))
    if snapshot.path is None:
        what = "the draft's config" if "draft" in flag else "the target's config"
        raise PatchcraftError(
            f"preflight not checked: {flag} {value} is not a local directory and revision {snapshot.revision} is not in the "
            f"local Hugging Face cache ({snapshot.repository}): {what} was not read, so the draft's layer ids were not checked; "
            f"download it first (huggingface-cli download {value} config.json), or pass the local directory; {WAY_OUT}"
        )
    notes.append(f"{flag} {value}: read from the local Hugging Face cache ({snapshot.path})")
    return snapshot.path


def _replay(entry: dict) -> None:
    sys.stdout.write(entry.get("stdout", ""))
    sys.stdout.flush()
    sys.stderr.write(entry.get("stderr", ""))
    console.print_line(f"{PREFIX}preflight verdict reused: nothing it read has changed since it was checked")


class _Tee(io.TextIOBase):
    """Writes through to ``stream`` and keeps a copy (the output of a verdict, to replay)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:  # type: ignore[override]
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return bool(self.stream.isatty())

    def getvalue(self) -> str:
        return self.copy.getvalue()


@contextlib.contextmanager
def _captured() -> Iterator[tuple[_Tee, _Tee]]:
    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # type: ignore[type-var]
        yield out, err
