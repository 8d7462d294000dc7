"""``patchcraft diff``: what ``apply`` would change, as a patch."""

from __future__ import annotations

from dataclasses import replace

from patchcraft.commands._pipeline import run_pipeline
from patchcraft.pipeline.stages import Options
from patchcraft.engine.records import Mode


def diff_command(options: Options) -> int:
    """Print what ``apply`` would change as a patch relative to the target root."""
    return run_pipeline(replace(options, show_diff=True), Mode.DIFF)
