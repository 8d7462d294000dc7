"""An overlay: the patched files of an SGLang (or vLLM) install, served at import time, the install untouched.

``build`` writes what the pipeline judged ``apply`` would write (the
harness proof included when torch is importable; :mod:`patchcraft.pipeline.serve`
runs the stages and refuses what they withhold) into a new version directory
(:mod:`patchcraft.overlay.store`), then points the overlay path at it:

- ``sitecustomize.py``: the bootstrap, :mod:`patchcraft.overlay.bootstrap`
  copied verbatim, with its ``.pyc`` (so a read-only overlay, or
  ``PYTHONDONTWRITEBYTECODE``, does not compile it in every process);
- ``patchcraft_modules.tsv``: its module table, one patched module a line;
- ``patchcraft_overlay.json``: the manifest. Per module: the overlay file,
  and the installed file it was built from (path, size, mtime, sha256);
  every file of the overlay with its sha256 (bootstrap included); the proof
  the patched code got (``harness-passed``, ``not-run (no torch)``, ...);
- ``tree/sglang/`` (``tree/vllm/`` for a vLLM install): a copy of the parts
  of the package patchcraft reads, patched, so ``patchcraft verify``/``smoke``/
  ``check-draft`` can run on it.

Directories are 755 and files 644, whatever the umask: a server running as
another user must be able to read it (Python skips an unreadable
``sitecustomize`` without a word). A cache entry is reused only when it is
owned, intact, current and proven enough (:mod:`patchcraft.overlay.check`).
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import tempfile
from dataclasses import dataclass
from importlib.util import cache_from_source
from pathlib import Path
from typing import Callable, Sequence

from patchcraft import __version__
from patchcraft.engine import result_cache
from patchcraft.overlay import bootstrap as overlay_bootstrap
from patchcraft.overlay import check as overlay_check
from patchcraft.overlay import store as overlay_store
from patchcraft.base.cache_root import ensure_directory
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.fetch import copy_parts
from patchcraft.overlay.bootstrap import BOOTSTRAP, MANIFEST, PACKAGE_DIR, TABLE, VLLM_PACKAGE_DIR
from patchcraft.engine.records import Mode, RunResult
from patchcraft.base.status import ModelStatus, Proof
from patchcraft.base.target import SglangTree

#: The manifest's ``proof`` when every patched model class passed the harness.
PROVEN = Proof.PASSED
#: The manifest's ``proof`` when the overlay patches no model class: nothing for the harness to run.
NOTHING_TO_PROVE = Proof.NOTHING_TO_PROVE


@dataclass(frozen=True)
class Overlay:
    directory: Path
    modules: tuple[str, ...]
    reused: bool
    result: RunResult | None = None
    #: The manifest's proof: :data:`PROVEN`, :data:`NOTHING_TO_PROVE`, or why not (``not-run (no torch)``, ...).
    proof: str = NOTHING_TO_PROVE
    #: Why a cache entry was not reused, or why this one is private (shown to the user).
    note: str = ""

    @property
    def package(self) -> Path:
        """The patched copy of the package, a TARGET for verify, smoke and check-draft."""
        return package_dir(self.directory)


def package_dir(directory: Path) -> Path:
    """Where the overlay in ``directory`` keeps the patched package (``tree/sglang``, or ``tree/vllm``)."""
    return overlay_check.tree_package(directory)


def _layout(tree: SglangTree) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Where ``tree``'s patched package goes in an overlay, and the parts of it patchcraft reads (copied there)."""
    if tree.engine == "vllm":
        from patchcraft.base.vllm_fetch import PARTS

        return VLLM_PACKAGE_DIR, PARTS
    from patchcraft.base.fetch import PATCHED_PARTS

    return PACKAGE_DIR, PATCHED_PARTS


def default_directory(tree: SglangTree, names: Sequence[str], runner: bool) -> Path | None:
    """``<cache>/overlays/<key>``: keyed by every file a run reads, the options and patchcraft itself."""
    from patchcraft.base.fetch import cache_dir

    key = result_cache.run_key(tree, Mode.APPLY, names, runner)
    return None if key is None else cache_dir() / "overlays" / key


def build(
    tree: SglangTree,
    judged: Callable[[], RunResult],
    out: Path | None = None,
    names: Sequence[str] = (),
    runner: bool = True,
    require_proof: bool = False,
) -> Overlay:
    """Build the overlay of ``tree`` into ``out`` (default: the content-addressed cache directory).

    A cache entry is reused when it is owned by this user (or root), intact,
    built from these very files, and, with ``require_proof``, proven by the
    harness when it can run here; anything else is rebuilt beside it, and
    an entry in a directory others can write is never used (a private
    overlay is built). ``out`` is always rebuilt. ``judged`` is the pipeline's
    apply of ``tree``, judged, proven and with nothing withheld (it raises
    otherwise); it is called only when the overlay is written.
    """
    if out is not None:
        return _build(tree, out, judged)
    directory = default_directory(tree, names, runner)
    if directory is None:
        raise PatchcraftError(f"{tree.package}: cannot read every file of the install to key the overlay")
    shared = _untrusted_store(directory.parent)
    if shared:  # someone else could swap what we build there: build where only we can write, and do not cache it
        private = Path(tempfile.mkdtemp(prefix="patchcraft-overlay-")) / "overlay"
        return _build(tree, private, judged, f"{shared}: not reused; this launch gets a private overlay")
    reused, note = _reusable(directory, require_proof)
    if reused is not None:
        return reused
    built = _build(tree, directory, judged, note)
    overlay_store.remove_orphans(directory.parent)  # what killed builds of any entry left
    return built


def _build(tree: SglangTree, directory: Path, judged: Callable[[], RunResult], note: str = "") -> Overlay:
    result = judged()
    built = _write(tree, result, directory)
    return Overlay(built.directory, built.modules, False, result, built.proof, note)


def _untrusted_store(overlays: Path) -> str | None:
    """Why the cache's ``overlays`` directory is not this user's alone, or None.

    ``overlays`` must be this user's (or root's) and writable by no one else;
    when it is this user's but group-writable (a umask of 002), it is made
    755 here, and the entries others may have put in it fail their own owner
    check. The cache above it may be group-writable, but not
    others-writable unless sticky (a 1777 shared cache is fine: ``overlays``
    in it is ours, or refused).
    """
    import stat

    if overlays.exists():
        info = overlays.lstat()
        if info.st_uid == os.getuid() and not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o022:
            os.chmod(overlays, 0o755)
        why = overlay_check.untrusted_directory(overlays)
        if why:
            return why
    root = overlays.parent
    if root.exists():
        info = root.stat()
        if info.st_uid not in (os.getuid(), 0):
            return f"{root}: owned by uid {info.st_uid}, not by this user (uid {os.getuid()}) or root"
        if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
            return f"{root}: writable by others, and not sticky (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _reusable(directory: Path, require_proof: bool) -> tuple[Overlay | None, str]:
    """The cache entry at ``directory`` if it may be served as it is; else (None, why not)."""
    if overlay_store.target(directory) is None:
        return None, ""
    if not hold(directory):  # first the lock, then the checks: nothing can remove it in between
        return None, f"{directory}: rebuilt (it is being removed)"
    try:
        problems = overlay_check.problems(directory)
        manifest = overlay_check.read_manifest(directory)
    except (PatchcraftError, OSError) as exc:
        return None, f"{directory}: rebuilt ({exc})"
    if problems:
        return None, f"{directory}: rebuilt: {problems[0]}"
    proof = str(manifest.get("proof", ""))
    if require_proof and proof not in (PROVEN, NOTHING_TO_PROVE) and _can_prove():
        return None, f"{directory}: rebuilt to prove it (it was built with proof {proof!r})"
    return Overlay(directory, tuple(manifest["modules"]), reused=True, proof=proof), ""


def _can_prove() -> bool:
    """Whether the harness can run here (imports torch: asked only of an entry that is not proven yet)."""
    from patchcraft.harness import torch_problem

    return torch_problem() is None


def module_name(tree: SglangTree, path: Path) -> str:
    rel = path.resolve().relative_to(tree.package.resolve().parent)
    return ".".join(rel.with_suffix("").parts)


def proof_of(result: RunResult) -> str:
    """What the harness said of the model classes this overlay patches, as one word for the manifest."""
    proofs = [m.proof or "not run" for m in result.models if m.is_model_class and m.status == ModelStatus.PATCHED]
    if not proofs:
        return NOTHING_TO_PROVE
    # A class the harness could not run itself (``harness-skipped``) shares its edit with classes that proved it.
    shown = [p for p in proofs if p != Proof.HARNESS_SKIPPED] or proofs
    return next((p for p in shown if p != PROVEN), PROVEN)


def _write(tree: SglangTree, result: RunResult, directory: Path) -> Overlay:
    ensure_directory(directory.parent)  # an unusable cache or --out parent: one line naming it (cache_root)
    try:
        version, lock = overlay_store.new_version(directory)
    except OSError as exc:
        raise PatchcraftError(f"{directory}: cannot write the overlay ({exc.strerror or exc})") from None
    try:
        modules = _write_files(tree, result, version)
        proof = proof_of(result)
        _write_manifest(tree, version, modules, proof)
        overlay_store.share(lock)  # complete: from now on it is held, not being built
        overlay_store.point(directory, version)
    except OSError as exc:
        overlay_store.discard(version, lock)
        raise PatchcraftError(f"{directory}: cannot write the overlay ({exc})") from None
    except BaseException:
        overlay_store.discard(version, lock)
        raise
    overlay_store.remove_unused(directory.parent, directory.name)
    _LOCKS.append(lock)  # held until this process ends, or by the server it execs (inherited)
    return Overlay(directory, tuple(modules), reused=False, result=result, proof=proof)


#: Locks on the versions this process built or serves: kept open for the process's life.
_LOCKS: list[int] = []


def _write_files(tree: SglangTree, result: RunResult, version: Path) -> dict[str, dict]:
    """The tree, the patched files, the bootstrap, its ``.pyc`` and its table; returns the manifest's modules."""
    where, parts = _layout(tree)
    package = version.joinpath(*where)
    copy_parts(tree.package, package, parts)  # what patchcraft reads, so `smoke --overlay` can run on the tree
    modules: dict[str, dict] = {}
    for change in result.changes:
        original = change.source.path
        rel = original.resolve().relative_to(tree.package.resolve())
        target = package / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(change.source.encode(change.after))
        data = original.read_bytes()
        info = original.stat()
        modules[module_name(tree, original)] = {
            "file": Path(*where, rel).as_posix(),
            "file_sha256": hashlib.sha256(target.read_bytes()).hexdigest(),
            "original": str(original.resolve()),
            "size": info.st_size,
            "mtime_ns": info.st_mtime_ns,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    rows = [_table_row(name, entry) for name, entry in sorted(modules.items())]
    (version / TABLE).write_text(f"{overlay_bootstrap.HEADER}\t{len(rows)}\n" + "".join(rows), encoding="utf-8")
    bootstrap = version / BOOTSTRAP
    bootstrap.write_bytes(Path(overlay_bootstrap.__file__).read_bytes())
    # A hash-checked .pyc stays valid when the overlay is copied (COPY, cp -r) with new mtimes.
    py_compile.compile(
        str(bootstrap),
        cfile=cache_from_source(str(bootstrap)),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    _readable_by_all(version)
    return modules


def _table_row(name: str, entry: dict) -> str:
    fields = [
        name,
        entry["file"],
        entry["file_sha256"],
        entry["original"],
        str(entry["size"]),
        str(entry["mtime_ns"]),
        entry["sha256"],
    ]
    if any("\t" in f or "\n" in f for f in fields):
        raise PatchcraftError(f"{entry['original']}: a path with a tab or newline cannot go into the overlay's table")
    return "\t".join(fields) + "\n"


def _readable_by_all(version: Path) -> None:
    """Directories 755, files 644, whatever the umask and the modes of the install's files."""
    for root, dirs, files in os.walk(version):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def _write_manifest(tree: SglangTree, version: Path, modules: dict[str, dict], proof: str) -> None:
    files = {}
    for path, info in overlay_check.walk(version)[1:]:
        if not path.is_dir():
            files[path.relative_to(version).as_posix()] = overlay_check.sha256(path)
    manifest = {
        "patchcraft": __version__,
        "engine": tree.engine,
        "sglang_version": tree.version,
        "package": str(tree.package.resolve()),
        "modules": modules,
        "proof": proof,
        "files": files,
    }
    path = version / MANIFEST
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.chmod(path, 0o644)


def hold(directory: Path) -> bool:
    """Hold a shared lock on the version ``directory`` points to, for this process and a server it execs.

    False when it is being removed (or has no lock file: an older overlay).
    """
    version = overlay_store.target(directory)
    fd = None if version is None else overlay_store.hold(version)
    if fd is not None:
        _LOCKS.append(fd)
    return fd is not None


def remove(directory: Path) -> None:
    """Remove a throwaway overlay: the link and its version."""
    overlay_store.remove(directory)
