"""Reading and writing model files without losing anything the user had.

A source file is read as bytes and decoded once. The byte-order mark, the
declared encoding and the original bytes are remembered, so that
:meth:`Source.encode` gives back the exact bytes for an unchanged text and
a write can tell whether the file changed on disk since it was read. Line
endings stay inside the text (libcst keeps them), so CRLF files stay CRLF.

Writes are atomic per file and all-or-nothing per command
(:func:`write_all`): every new version is first written, compiled and
``fsync``-ed to a temporary file next to its target, and only then are
the temporary files moved into place with ``os.replace``, keeping mode and
owner. A failure before that leaves every file untouched; a failure while
moving restores the files already moved. A ``SIGKILL`` at any moment leaves
each file either as it was or fully patched, never half-written. Symlinks
are written through (the link stays a link) and hard links are broken
(a shared copy, such as a package cache, is never modified in place).
"""

from __future__ import annotations

import codecs
import functools
import glob
import importlib.util
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from patchcraft.base.errors import PatchcraftError

_CODING_RE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
#: Temporary files are ``.<name>.<random>.patchcraft`` next to their target.
TEMP_SUFFIX = ".patchcraft"
_TEMP_RE = re.compile(r"^\..+\.py\.[A-Za-z0-9_]{8}\.patchcraft$")


@dataclass(frozen=True)
class Source:
    """A decoded Python source file and how to encode it back."""

    path: Path
    text: str
    encoding: str = "utf-8"
    bom: bool = False
    #: The bytes as read (None when the text did not come from a file).
    raw: bytes | None = field(default=None, repr=False, compare=False)

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
    body = data[len(codecs.BOM_UTF8) :] if bom else data
    encoding = declared_encoding(body)
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise PatchcraftError(f"{path}: unknown encoding {encoding!r} in coding cookie") from None
    if bom and encoding != "utf-8":
        # Python itself refuses such a file ("encoding problem: ... with BOM").
        raise PatchcraftError(f"{path}: UTF-8 byte-order mark but coding cookie says {encoding}; refusing to touch it")
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        raise PatchcraftError(f"{path}: not valid {encoding} text (byte {exc.start}); refusing to touch it") from None
    return Source(path=path, text=text, encoding=encoding, bom=bom, raw=data)


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
    """Raise if ``text`` is not valid Python (never write such a file).

    A file can parse and still not compile (a repeated argument name, say);
    when the file as read fails the same way, the message says so.
    """
    problem = _compile_problem(text)
    if problem is None:
        return
    if _compile_problem(source.text) is not None:
        raise PatchcraftError(f"{source.path}: does not compile even before patching ({problem}); nothing was changed")
    raise PatchcraftError(  # a transform bug: never write its result
        f"{source.path}: patched result does not compile ({problem}); file left untouched"
    )


@functools.lru_cache(maxsize=64)
def _compile_problem(text: str) -> str | None:
    """Why ``text`` does not compile (its line and Python's message), or None; kept by text: a patched file
    compiled again (verify, ``apply --check``, the harness's copy of the same release) is not compiled twice."""
    try:
        compile(text, "<patched>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        return f"line {line}: {getattr(exc, 'msg', exc)}"
    return None


def check_writable(path: Path) -> None:
    """Fail early, before any file is written, if ``path`` cannot be replaced."""
    real = Path(os.path.realpath(path))
    if not os.access(real, os.W_OK) or not os.access(real.parent, os.W_OK):
        raise PatchcraftError(f"{path}: read-only (file or directory); nothing was changed")


# -- writing -----------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """A new version of one file, complete on disk next to it but not yet in place."""

    source: Source
    target: Path
    tmp: str


def prepare(source: Source, text: str) -> Pending:
    """Write ``text`` to a temporary file beside ``source`` (compiled, synced, same mode)."""
    check_compiles(source, text)
    if source.raw is not None and source.encode(source.text) != source.raw:
        raise PatchcraftError(
            f"{source.path}: its {source.encoding} bytes would not survive a rewrite unchanged; refusing to touch it"
        )
    # Write through a symlink: the link stays a link, its target gets the new text.
    target = Path(os.path.realpath(source.path))
    try:
        tmp = _stage(target, source.encode(text))
    except OSError as exc:
        raise PatchcraftError(f"{source.path}: cannot write ({exc.strerror or exc}); nothing was changed") from None
    return Pending(source=source, target=target, tmp=tmp)


def _stage(target: Path, data: bytes) -> str:
    """A synced temporary file beside ``target`` holding ``data``, with its mode and owner."""
    info = target.stat()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), stat.S_IMODE(info.st_mode))
            _keep_owner(handle.fileno(), info)
            os.fsync(handle.fileno())
    except BaseException:
        _remove_quietly(tmp)
        raise
    return tmp


def commit(pending: Pending) -> None:
    """Move a prepared file into place (one ``rename``), refusing if it changed meanwhile."""
    source = pending.source
    if source.raw is not None:
        try:
            current = pending.target.read_bytes()
        except OSError as exc:
            raise PatchcraftError(f"{source.path}: cannot read ({exc.strerror})") from None
        if current != source.raw:
            raise PatchcraftError(f"{source.path}: changed on disk while patchcraft ran; re-run to pick up the change")
    drop_stale_bytecode(source.path)
    os.replace(pending.tmp, pending.target)
    _sync_directory(pending.target.parent)
    # Again: an import between the first drop and the rename may have cached the old text.
    drop_stale_bytecode(source.path)


def discard(pending: Pending) -> None:
    _remove_quietly(pending.tmp)


def write_all(items: Sequence[tuple[Source, str]]) -> None:
    """Write every ``(source, new text)`` pair, or none of them.

    Phase one writes all temporary files; any failure there removes them
    and leaves every target untouched. Phase two renames them into place;
    a failure there puts back the files already renamed (best effort: a
    ``SIGKILL`` cannot be caught, but each rename is atomic on its own).
    """
    pending: list[Pending] = []
    try:
        for source, text in items:
            pending.append(prepare(source, text))
    except BaseException:
        for item in pending:
            discard(item)
        raise
    done: list[Pending] = []
    try:
        for item in pending:
            commit(item)
            done.append(item)
    except BaseException as exc:
        for item in pending[len(done) :]:
            discard(item)
        restored = _restore(done)
        if not isinstance(exc, (OSError, PatchcraftError)):
            raise
        if isinstance(exc, PatchcraftError):
            raise PatchcraftError(f"{exc}; {restored}") from None
        raise PatchcraftError(
            f"{pending[len(done)].source.path}: cannot write ({exc.strerror or exc}); {restored}"
        ) from None


def _restore(done: Sequence[Pending]) -> str:
    """Put the original bytes of already-replaced files back; describe the result."""
    lost = []
    for item in reversed(done):
        raw = item.source.raw if item.source.raw is not None else item.source.encode()
        try:
            os.replace(_stage(item.target, raw), item.target)
            drop_stale_bytecode(item.source.path)
        except OSError:
            lost.append(str(item.source.path))
    if lost:
        return f"these files were written and could not be restored: {', '.join(lost)}"
    return (
        "nothing was changed"
        if not done
        else f"the {len(done)} file(s) already written were restored; nothing was changed"
    )


def _keep_owner(fd: int, info: os.stat_result) -> None:
    """Give the new file the old owner when allowed (root rewriting a user's file)."""
    try:
        if (info.st_uid, info.st_gid) != (os.getuid(), os.getgid()):
            os.fchown(fd, info.st_uid, info.st_gid)
    except (OSError, AttributeError):
        pass


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (power loss, not just a killed process)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- clean-up ----------------------------------------------------------------


def drop_stale_bytecode(path: Path) -> None:
    """Remove the cached bytecode of ``path`` so stale bytecode never runs.

    Covers every interpreter and optimisation level in ``__pycache__`` next
    to the file (and next to its symlink target), plus a ``PYTHONPYCACHEPREFIX``
    tree. Unchecked hash-based ``.pyc`` files would otherwise keep running the
    old code after the source changed.
    """
    sources = {Path(path), Path(os.path.realpath(path))}
    for source in sources:
        cache = source.parent / "__pycache__"
        if cache.is_dir():
            for entry in cache.glob(f"{glob.escape(source.stem)}.*.pyc"):
                _remove_quietly(str(entry))
        for optimization in ("", 1, 2):
            try:
                _remove_quietly(importlib.util.cache_from_source(str(source), optimization=optimization))
            except (NotImplementedError, ValueError):
                pass


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of patchcraft's temporary files (never a source file)."""
    return bool(_TEMP_RE.match(name))


def stale_temp_files(directory: Path) -> list[Path]:
    """Temporary files a killed run left in ``directory``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / name for name in sorted(names) if is_temp_name(name)]


def remove_stale_temp_files(directories: Iterable[Path]) -> int:
    """Delete leftovers of killed runs (call only while holding the tree lock)."""
    count = 0
    for directory in directories:
        for entry in stale_temp_files(directory):
            _remove_quietly(str(entry))
            count += 1
    return count


def _remove_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass
