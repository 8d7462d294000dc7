"""The version of any SGLang tree: its version file, else ``git describe``, else the closest tested release.

A release (a wheel, an install, ``patchcraft fetch``) names its version in
``_version.py``, ``version.py`` or ``__init__.py``. A fork or a checkout
built with setuptools-scm often has none of them (``_version.py`` is
written at build time), and a copied package may have lost it. Then:

- a checkout (the package's model files tracked by a git repository at or
  above the tree): ``git describe --tags --always --dirty``, one line, git
  run with a timeout (a missing or failing git is no error: the next rule
  answers); when no tag is reachable (a fork's branch, whose release tags
  live elsewhere), the describe line is a bare commit and the closest
  release is found as well;
- otherwise the closest tested release by file digests: each of the tree's
  compared files (:data:`COMPARED`) is looked up in a table of every
  tested release's digests that ships with patchcraft
  (``data/release_digests.json``, digests only, written by
  ``python -m tools.release_digests``); the release with the most identical
  files wins (ties: the one whose file list differs least from the tree's;
  releases still tied, such as a post release that changed none of these
  files, are all named). Files holding patchcraft's marker are left out: they
  were patched, so they cannot be identical to any release.

A version file can mislead: a fork may ship the ``_version.py`` of an old
build (``lsglang`` 1.6.5 says ``0.5.15.dev105+g46b087b58`` while 184 of its
265 compared files are 0.5.22's and 17 are 0.5.15's). So a version file's
version is checked against the digests too; when the closest release is not
the release it names (nor, for a build between releases, the last release
before it: :func:`agrees`), both are said, ``0.5.15.dev105+g46b087b58
(version file; its files: closest to 0.5.22: 184 of 265 ...)``, and advice
reasons from the files: it speaks of "this tree" and names no release to
reinstall.

Patching is driven by the code, never by the version: the version only
says what the tree is, in text and JSON, and whether advice may speak of
"this release" (a version file the files agree with) or "this tree"
(anything else).
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from patchcraft import MARKER
from patchcraft.base.memo import Memo, stamp

#: Files compared with the releases, as paths inside the package (no sub-folders).
COMPARED: tuple[str, ...] = ("srt/models/*.py", "srt/model_executor/*.py")
#: How much of each sha256 the table keeps (64 bits: no two files of the table collide by chance).
DIGEST_CHARS = 16
#: Bump when the table's layout changes (tools/release_digests.py writes it).
TABLE_FORMAT = 1
#: The table that ships with patchcraft.
TABLE = Path(__file__).resolve().parent / "data" / "release_digests.json"
#: The files a version is read from, in this order.
VERSION_FILES: tuple[str, ...] = ("_version.py", "version.py", "__init__.py")
#: How long ``git describe`` may take.
GIT_TIMEOUT_S = 10

_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", re.MULTILINE)
_MARKER = MARKER.encode()


class VersionSource(str, enum.Enum):
    """Where a tree's version came from."""

    FILE = "file"
    GIT = "git"
    CLOSEST = "closest"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class TreeVersion:
    """A tree's version and where it came from.

    ``version`` is what JSON's ``sglang_version`` holds: the release a
    version file names, the ``git describe`` line, or ``unknown``.
    For a closest match, ``closest_release`` is the release and
    ``identical_files`` of ``compared_files`` (the tree's files compared)
    are byte for byte that release's; ``patched_files`` were left out.
    """

    version: str
    source: VersionSource
    #: For a version file's version: set only when the files are closest to another release (:attr:`misleads`).
    closest_release: Optional[str] = None
    #: Releases as close as ``closest_release`` (the same compared files: a post release that changed none of them).
    tied_releases: tuple[str, ...] = ()
    identical_files: int = 0
    compared_files: int = 0
    patched_files: int = 0
    #: When a version file misleads: the tested release its version names (``0.5.15`` for ``0.5.15.dev105``), if any,
    #: and how many of the compared files are that release's.
    named_release: Optional[str] = None
    named_identical: int = 0

    @property
    def label(self) -> str:
        """The version as text shows it: ``0.5.10``, ``v0.5.10-3-gabc1234 (git describe)``, ``unknown (closest to ...)``."""
        if self.source is VersionSource.FILE:
            if not self.misleads:
                return self.version
            named = f"; {self.named_identical} are {self.named_release}'s" if self.named_release else ""
            return f"{self.version} (version file; its files: {self._closest()}{named})"
        if self.source is VersionSource.GIT:
            closest = f"; {self._closest()}" if self.closest_release else ""
            return f"{self.version} (git describe{closest})"
        if self.source is VersionSource.CLOSEST:
            return f"unknown ({self._closest()})"
        return "unknown"

    def _closest(self) -> str:
        left_out = f"; {self.patched_files} patched by patchcraft, not compared" if self.patched_files else ""
        names = " or ".join((str(self.closest_release), *self.tied_releases))
        return (
            f"closest to {names}: {self.identical_files} of {self.compared_files} "
            f"model and runner files identical{left_out}"
        )

    @property
    def misleads(self) -> bool:
        """A version file names this version, but the tree's files are closest to another release."""
        return self.source is VersionSource.FILE and self.closest_release is not None

    @property
    def noun(self) -> str:
        """How advice names the tree: ``this release`` when a version file names it (and the files agree), else ``this tree``."""
        return "this release" if self.source is VersionSource.FILE and not self.misleads else "this tree"

    def as_json(self) -> dict[str, Any]:
        """The structured parts, for JSON beside ``sglang_version`` (docs/json.md); empty for a version file's version
        the files agree with."""
        if self.source is VersionSource.FILE and not self.misleads:
            return {}  # a release's documents keep exactly the keys they had
        fields: dict[str, Any] = {"sglang_version_source": self.source.value}
        if self.closest_release is not None:
            fields.update(
                closest_release=self.closest_release,
                tied_releases=list(self.tied_releases),
                identical_files=self.identical_files,
                compared_files=self.compared_files,
                patched_files=self.patched_files,
            )
        if self.misleads:
            fields.update(named_release=self.named_release, named_identical_files=self.named_identical)
        return fields


class VersionLabel(str):
    """A version as text shows it (:attr:`TreeVersion.label`), carrying the record it was read as.

    Records keep the version as a string (``RunResult.version``); JSON
    takes the structured parts from :attr:`info`, so a document says what
    the run read before it wrote, not what the tree reads after.
    """

    info: TreeVersion

    def __new__(cls, info: TreeVersion) -> VersionLabel:
        label = super().__new__(cls, info.label)
        label.info = info
        return label

    def __reduce__(self) -> tuple[Any, ...]:  # the result cache pickles records
        return (VersionLabel, (self.info,))


def identify(package: Path) -> TreeVersion:
    """The version of the SGLang package at ``package`` (never raises for an unreadable tree: ``unknown``)."""
    found = file_version(package)
    if found is not None:
        return checked_file_version(package, found)
    described = git_describe(package)
    if described is None:
        return closest_release(package)
    line, tagged = described
    if tagged:
        return TreeVersion(line, VersionSource.GIT)
    closest = closest_release(package)  # a bare commit says nothing of the release: say which one it is closest to
    return replace(closest, version=line, source=VersionSource.GIT)


def checked_file_version(package: Path, version: str) -> TreeVersion:
    """A version file's ``version``, with the closest release when the tree's files say another (:func:`agrees`)."""
    closest = _closest(package)
    if closest.closest_release is None or agrees(version, closest):
        return TreeVersion(version, VersionSource.FILE)
    named = named_release(version)
    identical = identical_files(package, named) if named is not None else 0
    return replace(closest, version=version, source=VersionSource.FILE, named_release=named, named_identical=identical)


def named_release(version: str, releases: Optional[list[str]] = None) -> str | None:
    """The tested release a version names: itself, else the first of its number (``0.5.15`` for ``0.5.15.dev105``)."""
    releases = releases if releases is not None else load_table()["releases"]
    if version in releases:
        return version
    number = _number(version)
    return next((name for name in releases if _number(name) == number), None)


def identical_files(package: Path, release: str, table: dict[str, Any] | None = None) -> int:
    """How many of the tree's compared files are byte for byte ``release``'s."""
    table = table if table is not None else load_table()
    index = table["releases"].index(release)
    ours, _ = tree_digests(package)
    files: dict[str, dict[str, list[int]]] = table["files"]
    return sum(index in files.get(path, {}).get(value, ()) for path, value in ours.items())


def agrees(version: str, closest: TreeVersion, releases: Optional[list[str]] = None) -> bool:
    """Whether a version file's ``version`` is what the closest release by digests says the tree is.

    It agrees when it is one of the closest releases; when it is no tested
    release (a dev, post or local build, a release newer than the table), a
    closest release of the same number (``0.5.15`` for ``0.5.15.post2``) or
    the last tested release before that number (``0.5.14`` for the build
    ``0.5.15.dev105``, ``0.5.23`` for ``0.5.24``) agrees too. A tested
    release whose files are another release's does not.
    """
    releases = releases if releases is not None else load_table()["releases"]
    closest_names = {closest.closest_release, *closest.tied_releases}
    if version in closest_names:
        return True
    if version in releases:
        return False
    number = _number(version)
    if number is None:
        return False
    if any(_number(name) == number for name in closest_names if name):
        return True
    before = [name for name in releases if (n := _number(name)) is not None and n < number]
    return bool(before) and before[-1] in closest_names


_NUMBER = re.compile(r"^v?(\d+(?:\.\d+)*)")


def _number(version: str) -> tuple[int, ...] | None:
    """The release number a version starts with (``0.5.15.dev105+g46b`` -> ``(0, 5, 15)``), or None."""
    match = _NUMBER.match(version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


#: The closest release of a tree, kept while its compared files are unchanged (:mod:`patchcraft.base.memo`).
_CLOSEST: Memo[TreeVersion] = Memo(keep=8)


def _closest(package: Path) -> TreeVersion:
    folders = [(package / pattern.rpartition("/")[0], False) for pattern in COMPARED]
    return _CLOSEST.get(str(package.resolve()), lambda: stamp(folders=folders), lambda: closest_release(package))


def tree_noun(package: Path) -> str:
    """How advice names the tree at ``package``: ``this release`` (a version file names it) or ``this tree``."""
    return identify(package).noun


def file_version(package: Path) -> str | None:
    """The ``__version__`` a version file of ``package`` names, or None."""
    for name in VERSION_FILES:
        try:
            text = (package / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = _VERSION_RE.search(text)
        if match:
            return match.group(1)
    return None


# -- git ---------------------------------------------------------------------------------------


def git_describe(package: Path) -> tuple[str, bool] | None:
    """``git describe --tags --always --dirty`` of the checkout tracking ``package``'s model files, and whether a tag was reachable; or None."""
    if not any((parent / ".git").exists() for parent in (package, *package.parents)):
        return None  # spare the subprocess: no repository at or above the tree
    tracked = _git(package, "ls-files", "--error-unmatch", "srt/models")
    if tracked is None or tracked.returncode != 0:
        return None  # a repository above that does not hold this tree (an install under a dotfiles repository)
    for tagged, args in ((True, ("--tags", "--dirty")), (False, ("--tags", "--always", "--dirty"))):
        proc = _git(package, "describe", *args)
        if proc is None:
            return None
        lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
        if proc.returncode == 0 and lines and lines[0].strip():
            return lines[0].strip(), tagged
    return None  # no commit yet


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(
            ["git", "-C", str(cwd), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"},
        )
    except (OSError, subprocess.SubprocessError):
        return None  # no git, or it hung: the closest release answers instead


# -- the closest release -----------------------------------------------------------------------


def is_compared(path: str) -> bool:
    """Whether ``path`` (inside the package, ``/``-separated) is one of the compared files."""
    return any(fnmatch.fnmatchcase(path, pattern) and path.count("/") == pattern.count("/") for pattern in COMPARED)


def digest(data: bytes) -> str:
    """A file's digest as the table holds it."""
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def tree_digests(package: Path) -> tuple[dict[str, str], int]:
    """``path -> digest`` of the tree's compared files, and how many were left out as patched by patchcraft."""
    found: dict[str, str] = {}
    patched = 0
    for pattern in COMPARED:
        folder, _, glob = pattern.rpartition("/")
        try:
            names = sorted(os.listdir(package / folder))
        except OSError:
            continue
        for name in names:
            if not fnmatch.fnmatchcase(name, glob):
                continue
            try:
                data = (package / folder / name).read_bytes()
            except OSError:
                continue  # a folder named like a file, a broken link: not compared
            if _MARKER in data:
                patched += 1
            else:
                found[f"{folder}/{name}"] = digest(data)
    return found, patched


_table: dict[str, Any] | None = None


def load_table() -> dict[str, Any]:
    """The shipped table (read once); an empty one if it is missing or damaged (then no release is closest)."""
    global _table
    if _table is None:
        try:
            loaded = json.loads(TABLE.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            loaded = None
        ok = isinstance(loaded, dict) and loaded.get("format") == TABLE_FORMAT
        _table = loaded if ok else {"releases": [], "files": {}}
    return _table


def closest_release(package: Path, table: dict[str, Any] | None = None) -> TreeVersion:
    """The tested release whose compared files are most often identical to the tree's."""
    table = table if table is not None else load_table()
    releases: list[str] = table["releases"]
    files: dict[str, dict[str, list[int]]] = table["files"]
    ours, patched = tree_digests(package)
    identical = [0] * len(releases)
    shared = [0] * len(releases)  # files the tree and the release both have, identical or not
    sizes = [0] * len(releases)
    for values in files.values():
        for indexes in values.values():
            for index in indexes:
                sizes[index] += 1
    for path, value in ours.items():
        for other, indexes in files.get(path, {}).items():
            for index in indexes:
                shared[index] += 1
                if other == value:
                    identical[index] += 1
    if not releases or not ours or max(identical) == 0:
        return TreeVersion("unknown", VersionSource.UNKNOWN, compared_files=len(ours), patched_files=patched)

    def rank(index: int) -> tuple[int, int]:
        differing = (sizes[index] - shared[index]) + (len(ours) - shared[index])  # files only one side has
        return identical[index], -differing

    top = max(map(rank, range(len(releases))))
    best = [releases[index] for index in range(len(releases)) if rank(index) == top]  # oldest first
    first = releases.index(best[0])
    return TreeVersion(
        "unknown",
        VersionSource.CLOSEST,
        closest_release=best[0],
        tied_releases=tuple(best[1:]),
        identical_files=identical[first],
        compared_files=len(ours),
        patched_files=patched,
    )
