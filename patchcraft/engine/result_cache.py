"""A cache of whole-run results: a second ``verify`` of an unchanged tree costs next to nothing.

A read-only run (``verify``, ``apply --check``, ``diff``) is a pure function
of the bytes it reads and of patchcraft itself. Its :class:`RunResult` is
stored under a key that hashes all of that:

- every file the engine may read: each ``*.py`` under ``srt/models/`` and
  ``srt/model_executor/`` (path and content) and the package's version
  files, so adding, removing or changing a single byte of one changes the
  key (the directory listing is part of the key too);
- the run's parameters: mode, ``--model`` names, the runner flag and the
  tree (package, root, the files named);
- patchcraft's version and the content of its own sources and of the
  transforms (a development edit invalidates every entry), the Python
  version and the libcst version.

A hit never imports libcst (:mod:`patchcraft.base.lazy`). The key is computed
again after a miss's run and the result is stored only if nothing changed
meanwhile, so an entry never pairs one content with another's result.
Writing commands are never cached, and any trouble with the cache (an
unwritable directory, a damaged entry) just means a normal run.

Entries live in ``<cache>/runs`` (``$PATCHCRAFT_CACHE``, else
``$XDG_CACHE_HOME/patchcraft``, else ``~/.cache/patchcraft``); the newest
:data:`KEEP` are kept. ``PATCHCRAFT_NO_CACHE=1`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import sys
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from patchcraft import __version__
from patchcraft.base import digests
from patchcraft.base.cache_root import ensure_directory, keep_newest, remove_quietly
from patchcraft.base.errors import PatchcraftError
from patchcraft.engine.records import FileChange, Mode, RunResult
from patchcraft.base.target import SglangTree

#: Modes whose result depends only on what they read (nothing is written).
CACHEABLE = frozenset({Mode.VERIFY, Mode.CHECK, Mode.DIFF})
#: Entries kept; older ones are removed when a new one is stored.
KEEP = 32
#: Bump when the entry format changes.
FORMAT = 1
#: The package files :attr:`SglangTree.version` reads.
VERSION_FILES = ("_version.py", "version.py", "__init__.py")
#: The release's aux collectors, read by planning.
COLLECTORS = "srt/layers/aux_hidden_states.py"

_CODE_HASH: str | None = None


def enabled() -> bool:
    return os.environ.get("PATCHCRAFT_NO_CACHE", "") in ("", "0")


def directory() -> Path:
    """``<cache>/runs``, next to the fetched releases."""
    from patchcraft.base.fetch import cache_dir

    return cache_dir() / "runs"


def inputs(tree: SglangTree) -> list[str]:
    """Every file a run on ``tree`` may read, in a fixed order (strings: a warm run lists about 800)."""
    package = str(tree.package)
    files: list[str] = []
    for folder in (tree.models_dir, tree.executor_dir):
        files.extend(_python_files(str(folder)))
    files.extend(os.path.join(package, name) for name in VERSION_FILES)
    files.append(os.path.join(package, COLLECTORS))  # whether a collector copies (plan.collector_copies)
    # The allreduce-fusion row: the decision it edits, and whether layers reduce at their boundary.
    layers = os.path.join(package, "srt", "layers")
    files.append(os.path.join(layers, "communicator.py"))
    files.append(os.path.join(layers, "layer_boundary", "__init__.py"))
    # ... and the subclasses of LayerCommunicator that override the decision (anywhere in srt/layers/).
    files.extend(
        name
        for name in _python_files(layers)
        if os.path.basename(name) != "communicator.py" and "layer_boundary" not in name[len(layers) :].split(os.sep)
    )
    return files


def _python_files(folder: str) -> list[str]:
    """``sorted(Path(folder).rglob("*.py"))`` as strings (files only, links to folders not entered), without pathlib's cost."""
    found: list[str] = []
    for root, _dirs, names in os.walk(folder):
        found.extend(os.path.join(root, name) for name in names if name.endswith(".py"))
    return sorted(found, key=lambda name: name.split(os.sep))


def run_key(tree: SglangTree, mode: Mode, names: Sequence[str], runner: bool, fusion: bool = True) -> str | None:
    """The key of a run: a hex digest, or None when an input cannot be read."""
    digest = hashlib.sha256()
    header: tuple[object, ...] = (
        FORMAT,
        __version__,
        code_hash(),
        sys.version,
        _libcst_version(),
        mode.value,
        tuple(names),
        runner,
    )
    if not fusion:  # the default run keeps the key it had before the fusion row existed
        header += ("no-fusion-fix",)
    digest.update(repr(header).encode())
    digest.update(repr((str(tree.package), str(tree.root), tuple(map(str, tree.only_files)))).encode())
    try:
        for path in inputs(tree):
            try:
                data: bytes | None = bytes.fromhex(digests.sha256(path))
            except FileNotFoundError:
                data = None  # a version file the package does not have
            except OSError:
                return None
            # Length-prefixed: no two different listings can hash alike.
            name = path.encode("utf-8", "surrogateescape")
            digest.update(len(name).to_bytes(8, "little") + name)
            digest.update(b"-" if data is None else data)
    finally:
        digests.save()
    return digest.hexdigest()


def code_hash() -> str:
    """A digest of patchcraft's own sources and the transforms (computed once per process)."""
    global _CODE_HASH
    if _CODE_HASH is None:
        digest = hashlib.sha256()
        for path in _code_files():
            digest.update(str(path).encode("utf-8", "surrogateescape") + b"\0")
            try:
                digest.update(bytes.fromhex(digests.sha256(path)))
            except OSError:
                digest.update(b"-")
        _CODE_HASH = digest.hexdigest()
    return _CODE_HASH


def _code_files() -> list[Path]:
    import patchcraft

    roots = {Path(patchcraft.__file__).resolve().parent}
    spec = importlib.util.find_spec("patchcraft.transforms")  # imports patchcraft only, not libcst
    for location in (spec.submodule_search_locations or []) if spec else []:
        roots.add(Path(location).resolve())
    return sorted({Path(path) for root in roots for path in _python_files(str(root))})


def _libcst_version() -> str:
    """libcst's version, read from its files without importing it."""
    spec = importlib.util.find_spec("libcst")
    if spec is None or not spec.origin:
        return "none"
    try:
        return (Path(spec.origin).parent / "_version.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return spec.origin


def load(key: str) -> RunResult | None:
    """The stored result for ``key``, or None (a damaged entry is removed)."""
    try:
        path = directory() / f"{key}.pickle"
    except PatchcraftError:  # no cache root (no home directory): a normal run
        return None
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_uid != os.getuid():
                return None  # unpickling runs code: only ever load our own entries
            data = handle.read()
    except OSError:
        return None
    try:
        result = pickle.loads(zlib.decompress(data))
    except Exception:  # damaged or from an incompatible build: drop it
        remove_quietly(path)
        return None
    if not isinstance(result, RunResult):
        return None
    try:
        os.utime(path)  # recently used: kept by keep_newest
    except OSError:
        pass
    return result


def store(key: str, result: RunResult) -> None:
    """Store ``result`` under ``key`` atomically; failures are ignored (the cache is optional)."""
    # The raw bytes only serve writes, which are never cached.
    light = replace(result, changes=tuple(_without_raw(c) for c in result.changes))
    data = zlib.compress(pickle.dumps(light, protocol=pickle.HIGHEST_PROTOCOL), 1)
    try:
        folder = ensure_directory(directory(), private=True)
        fd, tmp = tempfile.mkstemp(prefix=".entry.", dir=folder)  # mode 0600
    except (PatchcraftError, OSError):  # the cache is optional: an unusable one means a normal run
        return
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, folder / f"{key}.pickle")
    except OSError:
        remove_quietly(Path(tmp))
        return
    keep_newest(folder, "*.pickle", KEEP)


def _without_raw(change: FileChange) -> FileChange:
    return replace(change, source=replace(change.source, raw=None))


def cached_run(
    tree: SglangTree,
    mode: Mode,
    names: Sequence[str],
    runner: bool,
    compute: Callable[[], RunResult],
    fusion: bool = True,
) -> RunResult:
    """``compute()``, or its stored result when nothing it depends on changed since."""
    if mode not in CACHEABLE or not enabled():
        return compute()
    key = run_key(tree, mode, names, runner, fusion)
    if key is not None:
        hit = load(key)
        if hit is not None:
            return hit
    result = compute()
    if key is not None and run_key(tree, mode, names, runner, fusion) == key:
        store(key, result)
    return result
