"""``patchcraft cache prune``: remove the cached overlays nothing uses; never one in use.

An overlay is in use while a process holds a shared lock on its version's
lock file: every process whose overlay bootstrap ran holds one, and
``patchcraft run`` takes it before it execs the server
(:mod:`patchcraft.overlay.store`). An overlay without a lock file (built by
an older patchcraft) is in use while a process this user can see has it on
``PYTHONPATH``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from patchcraft.ui import console, documents
from patchcraft.overlay import store as overlay_store
from patchcraft.ui.choices import OutputFormat
from patchcraft.ui.machine_output import OK


def prune_command(output_format: OutputFormat) -> int:
    """Remove every unused overlay in ``<cache>/overlays``, and build temp dirs whose builder is gone."""
    from patchcraft.base.fetch import cache_dir

    overlays = cache_dir() / "overlays"
    removed: list[Path] = []
    kept: list[Path] = []
    for entry in sorted(overlays.iterdir()) if overlays.is_dir() else []:
        if entry.name.startswith("."):
            continue  # versions and temp dirs: handled with their entry's name below
        removed_here, kept_here = _prune_entry(overlays, entry)
        removed += removed_here
        kept += kept_here
    orphans, held = overlay_store.remove_orphans(overlays)
    removed += orphans
    kept += held
    if output_format == OutputFormat.JSON:
        console.print_json(documents.prune_json(removed, kept))
        return OK
    for path in kept:
        console.print_line(f"kept (in use): {path}")
    console.print_line(
        f"patchcraft cache prune: removed {len(removed)} overlay directories, kept {len(kept)} in use, in {overlays}"
    )
    return OK


def _prune_entry(overlays: Path, entry: Path) -> tuple[list[Path], list[Path]]:
    """One cache entry: its old versions, then itself (link and version) if nothing holds it."""
    removed = overlay_store.remove_unused(overlays, entry.name, keep_previous=False)
    current = overlay_store.target(entry)
    if current is None:
        if entry.is_symlink():
            entry.unlink()  # a link to nothing
        return removed, []
    if entry.is_symlink():
        if not overlay_store.remove_if_unused(current, link=entry):
            return removed, [entry]
        return removed + [current], []
    # A real directory: an overlay of an older patchcraft (no lock file), in use while on someone's PYTHONPATH.
    if current.resolve() in overlay_store.on_pythonpath():
        return removed, [entry]
    shutil.rmtree(entry, ignore_errors=True)
    return removed + [entry], []
