"""A vLLM tree as ``patchcraft apply --engine vllm`` would leave it, in a private copy: where a vLLM fix that
names apply is proven.

check-draft offers a vLLM fix only after re-running the whole vLLM check
with it applied (:mod:`patchcraft.analysis.vllm_draft_check`). For a fix
that needs the patch (id 0 on the DeepSeek family, docs/vllm.md), the check
runs on this copy: the parts of the package patchcraft reads
(:data:`patchcraft.base.vllm_fetch.PARTS`), with every file the engine would
write for the model replaced by its patched text
(:func:`patchcraft.engine.tree_run.run`, the model's ``--model`` closure).
The tree itself is never written. As :mod:`patchcraft.analysis.applied`
does for SGLang: one copy per (tree, model), kept while the process runs,
removed at exit.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.fetch import copy_parts
from patchcraft.base.vllm_fetch import PARTS
from patchcraft.base.vllm_tree import VllmTree, resolve_vllm_target
from patchcraft.engine.records import Mode


@dataclass(frozen=True)
class VllmApplied:
    """The tree after apply (None: apply writes nothing for this model, or refuses), and why not."""

    tree: VllmTree | None
    why: str = ""
    #: The files apply would write for this model, relative to the tree root.
    written: tuple[str, ...] = ()


_CACHE: dict[tuple[Path, str], VllmApplied] = {}


def applied_vllm_tree(tree: VllmTree, label: str) -> VllmApplied:
    """``tree`` in a private copy with what ``patchcraft apply --engine vllm --model LABEL`` would write."""
    key = (tree.package, label)
    if key not in _CACHE:
        _CACHE[key] = _build(tree, label)
    return _CACHE[key]


def _build(tree: VllmTree, label: str) -> VllmApplied:
    from patchcraft.engine.tree_run import run

    try:
        result = run(tree, Mode.APPLY, (label,))
    except PatchcraftError as exc:
        return VllmApplied(None, f"`patchcraft apply --engine vllm` refuses this tree: {exc}")
    if not result.changes:
        return VllmApplied(
            None,
            f"`patchcraft apply --engine vllm` would write nothing for {label} (its rows: "
            + ", ".join(f"{m.model} {m.status}" for m in result.models if m.model == label)
            + ")",
        )
    directory = Path(tempfile.mkdtemp(prefix="patchcraft-vllm-applied-"))
    atexit.register(shutil.rmtree, directory, True)
    package = copy_parts(tree.package, directory / "vllm", PARTS)
    for change in result.changes:
        path = package / change.source.path.relative_to(tree.package)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.write_bytes(change.source.encode(change.after))
    written = tuple(change.rel for change in result.changes)
    try:
        after = resolve_vllm_target(str(package))
    except PatchcraftError as exc:
        return VllmApplied(None, f"the patched tree cannot be read: {exc}", written)
    return VllmApplied(after, "", written)
