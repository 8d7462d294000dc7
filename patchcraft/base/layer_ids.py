"""The aux layer-id list a user writes (``--layer-ids -1,2,30``), parsed in one place for every command."""

from __future__ import annotations

from patchcraft.base.errors import PatchcraftError


def parse_layer_ids(text: str) -> tuple[int, ...] | None:
    """``-1,2,30`` or ``[-1, 2, 30]`` -> ``(-1, 2, 30)``; ``none``: the setter's no-argument call, i.e. the defaults."""
    if text.strip().lower() == "none":
        return None
    try:
        ids = tuple(int(part) for part in text.replace(" ", "").strip("[]").split(",") if part)
    except ValueError:
        raise PatchcraftError(f"--layer-ids {text!r}: expected comma-separated integers like -1,2,30") from None
    if not ids:
        raise PatchcraftError("--layer-ids: no ids given")
    return ids
