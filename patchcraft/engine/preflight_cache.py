"""A cache of ``patchcraft run``'s preflight verdicts: a warm launch does not re-check an unchanged draft.

The preflight reads the release's flag definitions (a parse of
``server_args.py`` alone costs 0.3-1 s), the draft's config and weight
headers, the target's config and the patched tree, and then runs
check-draft. Its verdict is a function of those bytes and of patchcraft
itself, so an ``ok`` is stored and replayed:

- **The key** (no file of the check is read to compute it): the format,
  patchcraft's version and the hash of its own sources (``result_cache.code_hash``),
  the server command line, the working directory (relative paths), the
  variables that choose the hub cache, ``--trained-on``, the patched tree and
  the install, and whether torch is importable (the harness runs only then).
- **The entry**: the output to replay, and every input the check read, each
  with its digest: the draft's ``config.json``, its directory listing and
  each safetensors *header* (the bytes read for the fc width, never the
  weights), the target's ``config.json``, the hub ``refs/`` file, the
  ``--config`` file, the release's flag files and every file of the patched
  tree a run reads (``result_cache.inputs``). An entry is used only when every one
  of them is unchanged; a changed byte means the preflight runs again.

Only ``ok`` verdicts are stored: a refusal always runs, and says why, in
full. Entries are JSON (nothing in them runs), in ``<cache>/preflight``
(mode 0700), and are read only when the current user owns them: a
planted ``ok`` would skip the check. The cache is optional: any trouble
with it just means the preflight runs. ``PATCHCRAFT_NO_CACHE=1`` turns it off.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from patchcraft import __version__
from patchcraft.engine import cache_entries, result_cache
from patchcraft.base import digests
from patchcraft.base.cache_root import root
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.safetensors_header import header_bytes
from patchcraft.base.target import SglangTree

#: Bump when the entry format changes.
FORMAT = 2
#: Entries kept; the oldest are removed when one is stored.
KEEP = 64
#: The environment that decides where a hub name is looked up.
HUB_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME")


class InputKind(str, enum.Enum):
    """What of a path a verdict read (stored in the cache entry as the value)."""

    #: Its bytes.
    FILE = "file"
    #: A directory's names.
    LISTING = "listing"
    #: A safetensors header.
    HEADER = "header"


_KINDS = frozenset(k.value for k in InputKind)


@dataclass(frozen=True)
class Dependency:
    """One input of a verdict: what it read (``kind``) of which path."""

    kind: InputKind
    path: str | Path

    def digest(self) -> str:
        """The digest of what the check reads from it now ("-" when it cannot be read)."""
        try:
            if self.kind is InputKind.LISTING:
                data = "\0".join(sorted(os.listdir(self.path))).encode("utf-8", "surrogateescape")
            elif self.kind is InputKind.HEADER:
                data = header_bytes(self.path)
            else:
                return digests.sha256(self.path)  # remembered by its stat
        except (OSError, ValueError):
            return "-"
        return hashlib.sha256(data).hexdigest()


def enabled() -> bool:
    return result_cache.enabled()


def torch_importable() -> bool:
    """Whether torch can be found, without importing it (an import costs seconds; the verdict depends on it via the harness)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # sys.modules["torch"] is None, or a broken package
        return False


def key(argv: Sequence[str], package: Path, install: Path, trained_on: str | None) -> str:
    """The lookup key of a preflight (see the module docstring)."""
    header = (
        FORMAT,
        __version__,
        result_cache.code_hash(),
        tuple(argv),
        _cwd(),
        tuple(os.environ.get(name, "") for name in HUB_VARIABLES),
        trained_on,
        str(package),
        str(install),
        torch_importable(),
    )
    return hashlib.sha256(repr(header).encode("utf-8", "surrogateescape")).hexdigest()


def _cwd() -> str:
    """The working directory (relative paths in the command mean something else elsewhere); "" if it was removed."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def tree_dependencies(package: Path) -> list[Dependency]:
    """Every file of the patched tree a check-draft run may read."""
    tree = SglangTree(package=package, root=package.parent)
    return [Dependency(InputKind.FILE, path) for path in result_cache.inputs(tree)] + [
        Dependency(InputKind.LISTING, folder) for folder in (tree.models_dir, tree.executor_dir)
    ]


def draft_dependencies(directory: Path) -> list[Dependency]:
    """What ``read_draft`` reads: the config, the weights index, each safetensors header, and the listing."""
    found = [
        Dependency(InputKind.LISTING, directory),
        Dependency(InputKind.FILE, directory / "config.json"),
        Dependency(InputKind.FILE, directory / "model.safetensors.index.json"),
    ]
    return found + [Dependency(InputKind.HEADER, path) for path in sorted(directory.glob("*.safetensors"))]


def directory() -> Path:
    return root() / "preflight"


def load(lookup: str) -> dict | None:
    """The stored entry for ``lookup`` when it is ours, intact, and every input it recorded is unchanged; else None."""
    if not enabled():
        return None
    found = cache_entries.entry_in(directory, lookup, FORMAT)
    if found is None or not isinstance(found[1].get("inputs"), list):
        return None
    path, entry = found
    try:
        for kind, name, digest in entry["inputs"]:
            if kind not in _KINDS or Dependency(InputKind(kind), name).digest() != digest:
                return None
    finally:
        digests.save()
    cache_entries.used(path)
    return entry


def record(inputs: Sequence[Dependency]) -> list[list[str]]:
    """Each input with its digest now: taken before the check, and compared after it (nothing changed meanwhile)."""
    try:
        return [[d.kind.value, str(d.path), d.digest()] for d in inputs]
    finally:
        digests.save()


def store(lookup: str, recorded: list[list[str]], stdout: str, stderr: str) -> None:
    """Store an ok verdict under ``lookup`` atomically, if its inputs are still as ``recorded``; failures are ignored."""
    if not enabled() or record([Dependency(InputKind(k), p) for k, p, _ in recorded if k in _KINDS]) != recorded:
        return
    entry = {"format": FORMAT, "key": lookup, "inputs": recorded, "stdout": stdout, "stderr": stderr}
    try:
        folder = directory()
    except PatchcraftError:
        return
    cache_entries.write_entry(folder, lookup, entry, KEEP)
