"""``--release``: the one handler every command that takes it shares."""

from __future__ import annotations

from typing import Sequence

from patchcraft.base.engines import ServingEngine
from patchcraft.base.errors import PatchcraftError


def release_targets(
    targets: Sequence[str], release: str | None, engine: ServingEngine | None = None
) -> tuple[str, ...]:
    """``targets``, or the cached tree of SGLang ``release`` (vLLM's with ``engine`` vllm; fetched on first use);
    never both."""
    if not release:
        return tuple(targets)
    if targets:
        raise PatchcraftError("give either TARGET or --release, not both")
    if engine is ServingEngine.VLLM:
        from patchcraft.base.vllm_fetch import fetch_vllm

        return (str(fetch_vllm(release)),)
    from patchcraft.base.fetch import fetch  # only now: most runs take a TARGET

    return (str(fetch(release)),)
