"""``patchcraft fetch [--engine sglang|vllm] VERSION``: a release's source into the cache."""

from __future__ import annotations

import sys
from pathlib import Path

from patchcraft.base.engines import ServingEngine
from patchcraft.base.fetch import fetch as fetch_release
from patchcraft.base.vllm_fetch import fetch_vllm
from patchcraft.ui import console


def fetch_command(version: str, dest: str | None, engine: ServingEngine = ServingEngine.SGLANG) -> int:
    """Download ``engine``'s release ``version`` into the cache and print its package root.

    vLLM: only the Python files patchcraft reads are kept (docs/vllm.md), never the 400 MB wheel.
    """
    fetcher = fetch_vllm if engine is ServingEngine.VLLM else fetch_release
    with console.progress(f"fetching {engine} {version}") as status:
        package = fetcher(version, Path(dest) if dest else None, on_step=status.update)
    sys.stdout.write(f"{package}\n")
    return 0
