"""``--release``: the one handler every command that takes it shares."""

from __future__ import annotations

from typing import Sequence

from patchcraft.base.errors import PatchcraftError


def release_targets(targets: Sequence[str], release: str | None) -> tuple[str, ...]:
    """``targets``, or the cached tree of SGLang ``release`` (fetched on first use); never both."""
    if not release:
        return tuple(targets)
    if targets:
        raise PatchcraftError("give either TARGET or --release, not both")
    from patchcraft.base.fetch import fetch  # only now: most runs take a TARGET

    return (str(fetch(release)),)
