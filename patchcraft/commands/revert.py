"""``patchcraft revert``: remove exactly what patchcraft inserted."""

from __future__ import annotations

from patchcraft.commands._pipeline import run_pipeline
from patchcraft.pipeline.stages import Options
from patchcraft.engine.records import Mode


def revert_command(options: Options) -> int:
    """Remove exactly what patchcraft inserted, byte for byte."""
    return run_pipeline(options, Mode.REVERT)
