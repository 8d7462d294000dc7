"""Harness runs remembered by the bytes they ran: the same class, ids and files answer without running again.

A harness run is a function of what it compiles and what it is asked: one
model class's scenarios (``apply``'s proof, ``smoke``, ``verify --smoke``),
or one id list's setter and forward (``explain``, and every fix
``check-draft`` proves). Each is kept in the cache under a key made, by
content and never by path, of:

- the sha256 of every ``*.py`` file under the tree's ``srt/models/`` (read
  through :mod:`patchcraft.base.digests`, remembered by stat), each text
  handed in instead of a file (what ``apply`` would write) replacing that
  file's (both digests are in the key: the plan reads the file, the run
  the text), any such text outside ``srt/models/`` by its path in the package,
  and the release's ``srt/layers/aux_hidden_states.py`` (the one other file
  the harness loads); for vLLM (:mod:`patchcraft.harness.vllm_runs`), every
  ``*.py`` file of the parts of the package patchcraft reads
  (:data:`patchcraft.base.vllm_fetch.PARTS`) the same way;
- what is asked: the kind of run, the model class's label, the ids and the
  layer count, or the check;
- the code that ran it: patchcraft's version and the digest of its sources,
  torch's version (read from its files), Python's version and platform.

So a second copy of the same release (another checkout, a test's private
copy, an install patched the same way) is answered by the first one's run,
and any byte changed in any model file is another key. A run is stored only
when it opened nothing else under the package while it ran (an audit of
what it opened: :func:`patchcraft.engine.verdict_cache.recording`); one that
did is run every time. Entries are checked as every verdict cache's are
(:mod:`patchcraft.engine.cache_entries`: owned by this user, written by no
one else, intact, of this key); a damaged or foreign entry is removed and
the run made again. ``PATCHCRAFT_NO_CACHE=1`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TypeVar

from patchcraft import __version__
from patchcraft.base import digests
from patchcraft.base.cache_root import remove_quietly, root
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.vllm_fetch import PARTS as VLLM_PARTS
from patchcraft.engine import cache_entries, result_cache, verdict_cache

#: Bump when an entry's shape changes.
FORMAT = 1
#: Entries kept; the least recently used are removed when one is stored.
KEEP = 2048
#: The one file outside ``srt/models/`` the harness reads (harness.assemble.load_aux_module).
AUX = os.path.join("srt", "layers", "aux_hidden_states.py")

T = TypeVar("T")


def directory() -> Path:
    return root() / "harness-runs"


@dataclass(frozen=True)
class Inputs:
    """The parts of a package a kind of harness run reads: folders (every ``*.py`` under them) and single files."""

    folders: tuple[str, ...]
    files: tuple[str, ...] = ()

    def holds(self, package: Path, name: str) -> bool:
        """Whether the file ``name`` (absolute) is one the key is made of: a ``*.py`` under a folder, or a file."""
        for base in {os.path.abspath(package), os.path.realpath(package)}:
            if any(name == os.path.join(base, file) for file in self.files):
                return True
            folders = tuple(os.path.join(base, folder) + os.sep for folder in self.folders)
            if name.endswith(".py") and name.startswith(folders):
                return True
        return False


#: SGLang's harness: the model files, and the release's own aux collector.
SGLANG_INPUTS = Inputs(("srt/models",), (AUX,))
#: vLLM's harness: the Python of every part of the package patchcraft keeps (its slim archive's).
VLLM_INPUTS = Inputs(
    tuple(part.rstrip("/") for part in VLLM_PARTS if part.endswith("/")),
    tuple(part for part in VLLM_PARTS if not part.endswith("/")),
)


def content(package: Path, texts: Optional[Mapping[Path, str]] = None, inputs: Inputs = SGLANG_INPUTS) -> str:
    """The digest of what a harness run on ``package`` compiles (see the module docstring)."""
    package = Path(package).resolve()
    given = {Path(p).resolve(): t for p, t in (texts or {}).items()}
    parts: list[str] = []
    try:
        for folder in inputs.folders:
            for path in _python_files(package / folder):
                text = given.pop(path, None)  # the file as planned (on disk) and as run (the text handed in)
                ran = "" if text is None else f" ran {_text_digest(text)}"
                parts.append(f"{path.relative_to(package)} {digests.sha256(path)}{ran}")
        for name in inputs.files:
            path = package / name
            text = given.pop(path, None)
            on_disk = digests.sha256(path) if path.is_file() else "-"
            parts.append(f"{name} {on_disk}" + ("" if text is None else f" ran {_text_digest(text)}"))
    finally:
        digests.save()
    for path, text in sorted(given.items()):  # a text for a file outside the parts read (or not there yet)
        parts.append(f"text {os.path.relpath(path, package)} {_text_digest(text)}")
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def _python_files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for where, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(where) / name for name in sorted(names) if name.endswith(".py")]
    return found


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def key(kind: str, tree_content: str, asked: object) -> str:
    """The lookup key of one run: its kind, what it compiles, what is asked (by ``repr``) and the code that runs it."""
    header = (
        FORMAT,
        __version__,
        result_cache.code_hash(),
        sys.version,
        sys.platform,
        verdict_cache.version_text("torch", "version.py"),
        kind,
        tree_content,
        repr(asked),
    )
    return hashlib.sha256(repr(header).encode("utf-8", "surrogateescape")).hexdigest()


def remembered(
    kind: str,
    package: Path,
    texts: Optional[Mapping[Path, str]],
    asked: object,
    compute: Callable[[], Optional[T]],
    encode: Callable[[T], Any],
    decode: Callable[[Any], T],
    inputs: Inputs = SGLANG_INPUTS,
    tree_content: Optional[str] = None,
) -> Optional[T]:
    """``compute()``, or the stored value of the same run (see the module docstring).

    ``encode`` turns the value into JSON data and ``decode`` back; a stored
    value ``decode`` refuses (any exception) is removed and computed again.
    ``compute()`` returning None (nothing ran: no torch) is passed on and not kept.
    ``tree_content``: :func:`content_of` the same package, texts and inputs, when the caller asks for many runs
    of one tree (it is read once).
    """
    if not result_cache.enabled():
        return compute()
    try:
        lookup = key(kind, tree_content or content(package, texts, inputs), asked)
    except (OSError, PatchcraftError):
        return compute()
    stored = _stored(lookup, decode)
    if stored is not None:
        return stored
    with verdict_cache.recording([package]) as recorder:
        value = compute()
    if value is None:  # nothing ran (no torch): nothing to keep
        return None
    data = encode(value)
    if _read_only(recorder, Path(package), inputs) and not _names_a_path(data, Path(package)):
        try:
            cache_entries.write_entry(directory(), lookup, {"format": FORMAT, "key": lookup, "value": data}, KEEP)
        except PatchcraftError:  # no cache folder (no home): the run stands, nothing is kept
            pass
    return value


def recall(
    kind: str,
    package: Path,
    texts: Optional[Mapping[Path, str]],
    asked: object,
    decode: Callable[[Any], T],
    inputs: Inputs = SGLANG_INPUTS,
    tree_content: Optional[str] = None,
) -> Optional[T]:
    """The kept value of this run, or None (nothing runs): :func:`remembered` without its computing half."""
    if not result_cache.enabled():
        return None
    try:
        return _stored(key(kind, tree_content or content(package, texts, inputs), asked), decode)
    except (OSError, PatchcraftError):
        return None


def content_of(package: Path, texts: Optional[Mapping[Path, str]], inputs: Inputs = SGLANG_INPUTS) -> Optional[str]:
    """:func:`content`, or None when the cache is off or the tree cannot be read (each run then finds out itself)."""
    if not result_cache.enabled():
        return None
    try:
        return content(package, texts, inputs)
    except (OSError, PatchcraftError):
        return None


def _stored(lookup: str, decode: Callable[[Any], T]) -> Optional[T]:
    """The value kept under ``lookup`` when its entry is ours, intact and of this key, and ``decode`` takes it."""
    found = cache_entries.entry_in(directory, lookup, FORMAT)
    if found is None:
        return None
    path, entry = found
    try:
        value = decode(entry["value"])
    except Exception:  # noqa: BLE001 - a stored value of another shape is never used
        remove_quietly(path)
        return None
    cache_entries.used(path)
    return value


def _names_a_path(data: Any, package: Path) -> bool:
    """Whether the value names this tree's own location (it would answer for another copy with the wrong one)."""
    text = json.dumps(data)
    return any(base in text for base in {os.path.abspath(package), os.path.realpath(package)})


def _read_only(recorder: verdict_cache.Recorder, package: Path, inputs: Inputs) -> bool:
    """Whether the run opened nothing under ``package`` but the files its key is made of."""
    # bytecode is Python's cache of a source it read (the aux module's): the source is what the key holds
    return all(name.endswith(".pyc") or inputs.holds(package, name) for name in recorder.files)
