"""The install as ``patchcraft apply`` would leave it, in a private copy: where a suggestion that names apply is proven.

check-draft offers a fix only after re-running the whole check with it
applied (:mod:`patchcraft.analysis.fixes`). For a fix that needs the patch,
the check runs on this copy: the parts of the package patchcraft reads
(the model files, the model runner, ``srt/layers`` files that define or
subclass the all-reduce decision, the server arguments and the version),
with every file the engine would write for the model replaced by its
patched text (:func:`patchcraft.engine.tree_run.run`, the model's
``--model`` closure, with the ``runner`` and ``allreduce-fusion`` rows
``apply`` adds). The install itself is never written.

One copy per model object, kept while the process runs (an LRU of a few
entries, removed at exit): one command proves every fix on the same copy.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from patchcraft.analysis.target_model import Model, load_model
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.fetch import PATCHED_PARTS, copy_parts
from patchcraft.base.target import resolve_target
from patchcraft.engine.records import Mode

#: Besides PATCHED_PARTS: what the fusion check and the flag check read.
_EXTRA_PARTS = ("srt/layers/communicator.py", "srt/server_args.py", "srt/arg_groups")
#: The all-reduce decision's name: ``srt/layers`` files mentioning it are copied (its subclasses, docs/fusion.md).
_DECISION = b"should_fuse_mlp_allreduce_with_next_layer"
_KEEP = 4


@dataclass(frozen=True)
class Applied:
    """The model after apply (None: apply changes nothing it serves, or cannot run), and why not."""

    model: Model | None
    why: str = ""
    #: The files apply would write for this model, relative to the tree root.
    written: tuple[str, ...] = ()


_CACHE: "OrderedDict[int, tuple[Model, Applied, Path | None]]" = OrderedDict()


def applied_model(model: Model) -> Applied:
    """``model`` on a private copy of its tree with what ``patchcraft apply`` would write for it."""
    cached = _CACHE.get(id(model))
    if cached is not None and cached[0] is model:
        _CACHE.move_to_end(id(model))
        return cached[1]
    applied, directory = _build(model)
    _CACHE[id(model)] = (model, applied, directory)
    while len(_CACHE) > _KEEP:
        _, (_, _, old) = _CACHE.popitem(last=False)
        _remove(old)
    return applied


def _build(model: Model) -> tuple[Applied, Path | None]:
    from patchcraft.engine.tree_run import run
    from patchcraft.transforms.keep_captured_states_reduced import communicator_path

    tree = model.tree
    try:
        # Planned from the model's own files, not the whole tree: the same changes (tree_run.run, ``reaching``).
        # The fusion row writes communicator.py or nothing: on a tree without one, its reading is skipped.
        fusion = communicator_path(tree.package).is_file()
        result = run(tree, Mode.APPLY, (model.label,), fusion=fusion, reaching=model.plan.files)
    except PatchcraftError as exc:
        return Applied(None, f"`patchcraft apply` refuses this tree: {exc}"), None
    if not result.changes:
        return Applied(None, "`patchcraft apply` would write nothing this model serves"), None
    directory = Path(tempfile.mkdtemp(prefix="patchcraft-applied-"))
    atexit.register(_remove, directory)
    package = directory / "sglang"
    copy_parts(tree.package, package, PATCHED_PARTS + _EXTRA_PARTS)
    _copy_decisions(tree.package, package)
    for change in result.changes:
        path = package / change.source.path.relative_to(tree.package)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.write_bytes(change.source.encode(change.after))
    written = tuple(change.rel for change in result.changes)
    try:
        after = load_model(resolve_target(str(package)), model.label)
    except PatchcraftError as exc:
        return Applied(None, f"the patched tree cannot be read: {exc}", written), directory
    return Applied(after, "", written), directory


def _copy_decisions(source: Path, package: Path) -> None:
    """The ``srt/layers`` files that define or override the all-reduce decision (the fusion check reads them)."""
    layers = source / "srt" / "layers"
    for path in sorted(layers.rglob("*.py")) if layers.is_dir() else ():
        try:
            if _DECISION not in path.read_bytes():
                continue
        except OSError:
            continue
        destination = package / path.relative_to(source)
        if not destination.exists():
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)


def _remove(directory: Path | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
