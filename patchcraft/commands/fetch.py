"""``patchcraft fetch VERSION``: a release's source into the cache."""

from __future__ import annotations

import sys
from pathlib import Path

from patchcraft.base.fetch import fetch as fetch_release
from patchcraft.ui import console


def fetch_command(version: str, dest: str | None) -> int:
    """Download SGLang ``version`` into the cache and print its package root."""
    with console.progress(f"fetching sglang {version}") as status:
        package = fetch_release(version, Path(dest) if dest else None, on_step=status.update)
    sys.stdout.write(f"{package}\n")
    return 0
