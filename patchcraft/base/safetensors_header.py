"""A safetensors file's header, read without the tensors: the one reader, with one bound.

A safetensors file starts with an 8-byte little-endian length, then that
many bytes of JSON naming each tensor's dtype, shape and offsets. The draft
check reads the ``fc.weight`` shape from it (:mod:`patchcraft.analysis.draft_check`),
and the preflight cache keys its verdicts by those same bytes
(:mod:`patchcraft.engine.preflight_cache`), so both read them here.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from patchcraft.base.errors import PatchcraftError

#: The longest header read: a real one is kilobytes; a larger length is no safetensors file.
MAX_HEADER = 100 * 1024 * 1024


def header_bytes(path: str | Path) -> bytes:
    """The 8-byte length and the header's bytes as they are on disk: what a verdict that read them depends on.

    As many bytes as the length says, or fewer when the file ends first; only
    the length when it is above :data:`MAX_HEADER` (nothing more is read),
    and what there is of it when the file is shorter than 8 bytes.
    Raises :class:`OSError` when the file cannot be read.
    """
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return head
        (size,) = struct.unpack("<Q", head)
        return head + (handle.read(size) if size <= MAX_HEADER else b"")


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file; whatever is wrong with it is a one-line :class:`PatchcraftError`."""
    try:
        data = header_bytes(path)
    except OSError as exc:
        raise PatchcraftError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) < 8:
        raise PatchcraftError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > MAX_HEADER:
        raise PatchcraftError(f"{path}: not a safetensors file (header length {size} is implausible)")
    if len(data) - 8 != size:
        raise PatchcraftError(f"{path}: truncated safetensors header")
    try:
        header = json.loads(data[8:])
    except (ValueError, UnicodeDecodeError):
        raise PatchcraftError(f"{path}: safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise PatchcraftError(f"{path}: safetensors header is not a JSON object")
    return header
