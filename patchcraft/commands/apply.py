"""``patchcraft apply`` (and ``apply --check``): patch in place, or say what would change."""

from __future__ import annotations

from patchcraft.commands._pipeline import run_pipeline
from patchcraft.pipeline.stages import Options
from patchcraft.engine.records import Mode


def apply_command(options: Options, check: bool = False) -> int:
    """Patch in place; with ``check``, write nothing and exit 1 if anything would change."""
    return run_pipeline(options, Mode.CHECK if check else Mode.APPLY)
