"""Is an overlay safe to serve: owned, intact, current, readable. Each problem names the path.

- **Owned** (:func:`untrusted`): every directory and file of it belongs to
  this user or root, and neither group nor others can write it. An entry
  someone else could write (a shared ``PATCHCRAFT_CACHE``) would run their
  code in every server process: it is never reused.
- **Intact** (:func:`damage`): every file the manifest lists (the bootstrap,
  its table and ``.pyc`` included) has the sha256 the manifest gives, and
  there is no file the manifest does not list.
- **Current** (:func:`stale`): the installed files it was built from have
  not changed.
- **Readable** (:func:`unreadable`): by others, or by a named user, since
  Python silently skips a ``sitecustomize`` it cannot read.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Iterable

from patchcraft.base import digests
from patchcraft.base.errors import PatchcraftError
from patchcraft.overlay.bootstrap import MANIFEST, PACKAGE_DIR, VLLM_PACKAGE_DIR

#: What :func:`walk` returns: each path with its ``lstat``.
Listing = list[tuple[Path, os.stat_result]]

#: What Python itself may add to an overlay: bytecode of the served modules.
_PYCACHE = "__pycache__"


def read_manifest(directory: Path) -> dict:
    """The manifest of the overlay in ``directory``; PatchcraftError naming the file if it is not one."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PatchcraftError(f"{path}: not an overlay ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("modules"), dict):
        raise PatchcraftError(f"{path}: not an overlay manifest")
    return manifest


def walk(directory: Path) -> list[tuple[Path, os.stat_result]]:
    """Every entry under ``directory`` (itself included), not following links, with its ``lstat``; names sorted per folder."""
    found = [(directory, os.lstat(directory))]

    def visit(folder: str) -> None:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: (not e.is_dir(follow_symlinks=False), e.name))
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            found.append((Path(entry.path), info))
            if stat.S_ISDIR(info.st_mode):
                visit(entry.path)

    visit(str(directory))
    return found


def untrusted(directory: Path, owners: Iterable[int] | None = None, listing: Listing | None = None) -> str | None:
    """Why ``directory`` (a link, the version it points to, all inside) must not be run, or None.

    ``owners``: the uids that may own it (default: this user and root);
    ``listing``: its :func:`walk`, when the caller has it.
    """
    allowed = set(owners) if owners is not None else {os.getuid(), 0}
    entries = []
    if directory.is_symlink():
        entries.append((directory, os.lstat(directory)))
        directory = directory.resolve()
    entries.append((directory.parent, os.stat(directory.parent)))
    try:
        entries.extend(listing if listing is not None else walk(directory))
    except OSError as exc:
        return f"{directory}: cannot be read ({exc.strerror})"
    for path, info in entries:
        problem = _unsafe(path, info, allowed, is_parent=path == directory.parent)
        if problem:
            return problem
    return None


def untrusted_directory(path: Path, sticky_ok: bool = False) -> str | None:
    """Why directory ``path`` is not this user's (or root's) alone, or None; ``sticky_ok``: a sticky 1777 one is fine."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return f"{path}: cannot be read ({exc.strerror})"
    return _unsafe(path, info, {os.getuid(), 0}, is_parent=sticky_ok)


def _unsafe(path: Path, info: os.stat_result, allowed: set[int], is_parent: bool) -> str | None:
    if info.st_uid not in allowed:
        return f"{path}: owned by uid {info.st_uid}, not by this user (uid {os.getuid()}) or root"
    if stat.S_ISLNK(info.st_mode):
        return None if not is_parent else f"{path}: a symbolic link"
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (is_parent and info.st_mode & stat.S_ISVTX):  # a sticky parent (/tmp) protects what is ours
        return f"{path}: writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def sha256(path: Path) -> str:
    """The file's sha256, remembered by its stat (:mod:`patchcraft.base.digests`)."""
    return digests.sha256(path)


def damage(directory: Path, listing: Listing | None = None) -> list[str]:
    """What in the overlay does not match its manifest, each naming the file (empty: intact).

    ``listing``: the :func:`walk` of the resolved ``directory``, when the caller has it.
    """
    directory = directory.resolve()
    manifest = read_manifest(directory)
    files = manifest.get("files")
    if not isinstance(files, dict):
        return [f"{directory / MANIFEST}: lists no files (built by an older patchcraft)"]
    prefix = len(str(directory)) + 1
    found = {str(path)[prefix:].replace(os.sep, "/"): (path, info) for path, info in (listing or walk(directory))[1:]}
    problems = []
    for rel, digest in sorted(files.items()):
        path = directory / rel
        entry = found.get(rel)
        if entry is None or not stat.S_ISREG(entry[1].st_mode):
            problems.append(f"{path}: missing from the overlay")
        elif sha256(path) != digest:
            problems.append(f"{path}: changed since the overlay was built (its sha256 is not the manifest's)")
    listed = set(files) | {MANIFEST}
    for rel, (path, info) in found.items():
        if not stat.S_ISDIR(info.st_mode) and rel not in listed and not _python_bytecode(rel):
            problems.append(f"{path}: not part of the overlay (the manifest does not list it)")
    return problems


def _python_bytecode(rel: str) -> bool:
    """``tree/.../__pycache__/x.pyc``: what Python writes when it imports a served module."""
    parts = rel.split("/")
    return parts[0] == PACKAGE_DIR[0] and len(parts) > 2 and parts[-2] == _PYCACHE and parts[-1].endswith(".pyc")


def stale(directory: Path) -> list[str]:
    """Installed files that changed since the overlay in ``directory`` was built (by hash)."""
    manifest = read_manifest(directory)
    problems = []
    for name, entry in sorted(manifest["modules"].items()):
        try:
            digest = sha256(Path(entry["original"]))
        except OSError as exc:
            problems.append(f"{entry['original']} ({name}): unreadable ({exc.strerror})")
            continue
        if digest != entry["sha256"]:
            problems.append(f"{entry['original']} ({name}) changed since the overlay was built")
    return problems


def problems(directory: Path, owners: Iterable[int] | None = None) -> list[str]:
    """Everything that stops the overlay in ``directory`` from being served: owner first, then damage, then staleness."""
    try:
        listing = walk(directory.resolve())
    except OSError as exc:
        return [f"{directory}: cannot be read ({exc.strerror})"]
    why = untrusted(directory, owners, listing)
    if why:
        return [why]
    try:
        return damage(directory, listing) or stale(directory)
    finally:
        digests.save()


def tree_package(directory: Path) -> Path:
    """The patched package of the overlay in ``directory``: ``tree/vllm`` for a vLLM overlay, else ``tree/sglang``."""
    vllm = directory.joinpath(*VLLM_PACKAGE_DIR)
    return vllm if vllm.is_dir() else directory.joinpath(*PACKAGE_DIR)


def engine_of(directory: Path) -> str:
    """Whose install the overlay in ``directory`` was built from: its manifest's ``engine`` (before it: sglang)."""
    return str(read_manifest(directory).get("engine", "sglang"))


def overlay_of(package: Path) -> Path | None:
    """The overlay whose patched tree ``package`` is (``<overlay>/tree/sglang`` or ``tree/vllm``), or None for any other tree."""
    root = package
    for _ in PACKAGE_DIR:
        root = root.parent
    return root if (root / MANIFEST).is_file() else None


def overlay_target(directory: Path) -> Path:
    """``--overlay DIR`` as a command's TARGET: the overlay's patched package, once it is safe to serve.

    Every command that takes an overlay takes it here (``verify``, ``smoke``,
    ``explain``, ``check-draft``): a directory with no manifest, a missing,
    emptied or changed ``sitecustomize.py`` (or any other file), a foreign
    owner or a changed install is one line naming the file (exit 2), never a
    verdict on files the server would not import.
    """
    if not (directory / MANIFEST).is_file() and directory.exists():
        raise PatchcraftError(
            f"{directory}: not an overlay (no {MANIFEST}; build one with `patchcraft overlay build --out {directory}`)"
        )
    require_usable(directory)
    return tree_package(directory)


def require_usable_tree(package: Path) -> None:
    """The full check of :func:`require_usable` when ``package`` is an overlay's tree; nothing for another tree."""
    overlay = overlay_of(package)
    if overlay is not None:
        require_usable(overlay)


def require_usable(directory: Path) -> None:
    """PatchcraftError (one line, the first problem, how to rebuild) unless the overlay is safe to serve."""
    if not directory.exists():
        raise PatchcraftError(f"{directory}: no such overlay")
    found = problems(directory)
    if found:
        raise PatchcraftError(f"{directory}: {found[0]}: rebuild it with `patchcraft overlay build --out {directory}`")


def unreadable(directory: Path, user: str | None = None) -> list[str]:
    """Paths of the overlay a server could not read: by others, or (``user``) by that user, the parents included."""
    who = _identity(user) if user else None
    problems = []
    if who is not None:
        resolved = directory.resolve()
        for parent in reversed(resolved.parents):
            if not _may(os.stat(parent), who, os.X_OK):
                problems.append(f"{parent}: {user} cannot enter it")
                return problems
    for path, info in walk(directory.resolve()):
        need = os.R_OK | (os.X_OK if stat.S_ISDIR(info.st_mode) else 0)
        if not _may(info, who, need):
            problems.append(f"{path}: not readable by {user or 'others'} (mode {stat.S_IMODE(info.st_mode):o})")
    return problems


def _identity(user: str) -> tuple[int, set[int]]:
    import grp
    import pwd

    try:
        entry = pwd.getpwnam(user) if not user.isdigit() else pwd.getpwuid(int(user))
    except KeyError:
        raise PatchcraftError(f"--user {user}: no such user") from None
    groups = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem}
    return entry.pw_uid, groups


def _may(info: os.stat_result, who: tuple[int, set[int]] | None, need: int) -> bool:
    """Whether ``who`` (None: others) may ``need`` (R_OK/X_OK bits) on a file with this stat, from its mode bits."""
    mode = stat.S_IMODE(info.st_mode)
    if who is None:
        bits = mode & 0o7
    elif who[0] == 0:
        return True
    elif info.st_uid == who[0]:
        bits = (mode >> 6) & 0o7
    elif info.st_gid in who[1]:
        bits = (mode >> 3) & 0o7
    else:
        bits = mode & 0o7
    return bits & need == need
