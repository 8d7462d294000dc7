"""safetensors_header.py: one reader of a safetensors header, one bound, for the draft check and the preflight cache."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.safetensors_header import MAX_HEADER, header_bytes, read_header


def _write(path: Path, header: bytes, size: int | None = None, tail: bytes = b"tensor bytes") -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if size is None else size) + header + tail)
    return path


def test_the_header_and_its_bytes(tmp_path: Path) -> None:
    header = json.dumps({"fc.weight": {"dtype": "BF16", "shape": [7168, 21504], "data_offsets": [0, 0]}}).encode()
    path = _write(tmp_path / "model.safetensors", header)
    assert read_header(path) == json.loads(header)
    assert header_bytes(path) == struct.pack("<Q", len(header)) + header  # never the tensors


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x01\x02", "not a safetensors file (shorter than its 8-byte header length)"),
        (
            struct.pack("<Q", MAX_HEADER + 1) + b"{}",
            f"not a safetensors file (header length {MAX_HEADER + 1} is implausible)",
        ),
        (struct.pack("<Q", 500) + b'{"fc.weight": ', "truncated safetensors header"),
        (struct.pack("<Q", 3) + b"{x}", "safetensors header is not JSON"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "safetensors header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "safetensors header is not a JSON object"),
    ],
)
def test_what_is_wrong_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(PatchcraftError) as caught:
        read_header(path)
    assert str(caught.value) == f"{path}: {message}"


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PatchcraftError, match=r"model\.safetensors: cannot read \(No such file or directory\)"):
        read_header(tmp_path / "model.safetensors")
    with pytest.raises(OSError):
        header_bytes(tmp_path / "model.safetensors")  # the preflight cache's digest says "-" for it


def test_the_bytes_stop_at_the_bound(tmp_path: Path) -> None:
    """What the preflight cache hashes: what there is of a short or truncated header, and no more than the bound."""
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    assert header_bytes(short) == b"\x01\x02"
    truncated = _write(tmp_path / "truncated.safetensors", b'{"a"', size=500, tail=b"")
    assert header_bytes(truncated) == struct.pack("<Q", 500) + b'{"a"'
    huge = _write(tmp_path / "huge.safetensors", b"{}", size=MAX_HEADER + 1)
    assert header_bytes(huge) == struct.pack("<Q", MAX_HEADER + 1)
