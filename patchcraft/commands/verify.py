"""``patchcraft verify``: every edit present and correct; writes nothing."""

from __future__ import annotations

from patchcraft.commands._pipeline import run_pipeline
from patchcraft.pipeline.stages import Options
from patchcraft.engine.records import Mode


def verify_command(options: Options) -> int:
    """Write nothing; report each edit, compilation and idempotence per model."""
    return run_pipeline(options, Mode.VERIFY)
