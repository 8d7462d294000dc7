"""Reading and writing model files without losing anything the user had.

A source file is read as bytes and decoded once. The byte-order mark and
the declared encoding are remembered so that :func:`encode` gives back the
exact bytes for an unchanged text. Line endings stay inside the text
(libcst keeps them), so CRLF files stay CRLF.

Writes are atomic: a temporary file in the same directory, compiled
first, then ``os.replace``, keeping the file mode. A failure at any point
leaves the original untouched.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from patchcraft.errors import PatchcraftError

_CODING_RE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


@dataclass(frozen=True)
class Source:
    """A decoded Python source file and how to encode it back."""

    path: Path
    text: str
    encoding: str = "utf-8"
    bom: bool = False

    def encode(self, text: str | None = None) -> bytes:
        data = (self.text if text is None else text).encode(self.encoding)
        return codecs.BOM_UTF8 + data if self.bom else data


def declared_encoding(data: bytes) -> str:
    """The PEP 263 encoding of ``data`` (first two lines), default utf-8."""
    for line in data.splitlines()[:2]:
        match = _CODING_RE.match(line)
        if match:
            name = match.group(1).decode("ascii")
            try:
                return codecs.lookup(name).name
            except LookupError:
                return name
    return "utf-8"


def decode(path: Path, data: bytes) -> Source:
    """Decode ``data`` read from ``path``, or raise a one-line error."""
    if not data.strip():
        raise PatchcraftError(f"{path}: file is empty; expected an SGLang model file")
    if b"\x00" in data:
        raise PatchcraftError(f"{path}: binary file (contains NUL bytes); refusing to touch it")
    bom = data.startswith(codecs.BOM_UTF8)
    body = data[len(codecs.BOM_UTF8):] if bom else data
    encoding = declared_encoding(body)
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise PatchcraftError(f"{path}: unknown encoding {encoding!r} in coding cookie") from None
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        raise PatchcraftError(
            f"{path}: not valid {encoding} text (byte {exc.start}); refusing to touch it"
        ) from None
    return Source(path=path, text=text, encoding=encoding, bom=bom)


def read_source(path: Path) -> Source:
    """Read and decode one file, turning OS errors into one-line errors."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PatchcraftError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise PatchcraftError(f"{path}: is a directory, expected a Python file") from None
    except OSError as exc:
        raise PatchcraftError(f"{path}: cannot read ({exc.strerror})") from None
    return decode(path, data)


def check_compiles(source: Source, text: str) -> None:
    """Raise if ``text`` is not valid Python (never write such a file)."""
    try:
        compile(text, str(source.path), "exec", dont_inherit=True)
    except SyntaxError as exc:  # pragma: no cover - would be a transform bug
        raise PatchcraftError(
            f"{source.path}: patched result does not compile (line {exc.lineno}: {exc.msg}); "
            "file left untouched"
        ) from None


def write_atomic(source: Source, text: str) -> None:
    """Replace ``source.path`` with ``text`` atomically, keeping its mode."""
    path = source.path
    check_compiles(source, text)
    data = source.encode(text)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".patchcraft", dir=path.parent)
    except OSError as exc:
        raise PatchcraftError(f"{path}: cannot write ({exc.strerror}); file left untouched") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except OSError as exc:
        _remove_quietly(tmp_name)
        raise PatchcraftError(f"{path}: cannot write ({exc.strerror}); file left untouched") from None
    except BaseException:
        _remove_quietly(tmp_name)
        raise
    drop_stale_bytecode(path)


def check_writable(path: Path) -> None:
    """Fail early, before any file is written, if ``path`` cannot be replaced."""
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        raise PatchcraftError(f"{path}: read-only (file or directory); nothing was changed")


def drop_stale_bytecode(path: Path) -> None:
    """Remove ``__pycache__`` entries of ``path`` so stale bytecode never runs."""
    cache = path.parent / "__pycache__"
    if not cache.is_dir():
        return
    for entry in cache.glob(f"{path.stem}.*.pyc"):
        _remove_quietly(str(entry))


def _remove_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass
