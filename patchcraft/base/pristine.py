"""A file's pristine text: what SGLang shipped, before anyone edited it.

Three places know it, tried in this order for each file:

- a git checkout or fork: the file at ``HEAD`` (``git show HEAD:path``);
- an installed SGLang, or a fork installed by pip (``sglang-kt``'s
  ``sglang_kt-0.7.2.dist-info``): the sha256 pip wrote into the ``RECORD``
  of the distribution that lists the package's files, whatever its name
  (urlsafe base64, no padding); when the file no longer matches it, the
  text comes from that distribution's wheel (its name and version are the
  dist-info folder's), fetched on demand, whose member must match the
  ``RECORD`` hash too;
- a release in patchcraft's cache (``patchcraft fetch``): the wheel it was
  unpacked from.

Nothing here is stored in patchcraft: the text is read from git or the
wheel each time. :class:`PristineSource` answers per file; where none of
the three applies, or the file is not in it, the answer says why.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.fetch import cache_dir, download_wheel, find_wheel
from patchcraft.base.sources import decode
from patchcraft.base.target import SglangTree


@dataclass(frozen=True)
class Pristine:
    """The pristine text of one file, or why there is none (``text`` None)."""

    text: str | None
    #: Where the text came from (``git HEAD``, ``RECORD``, ``RECORD + wheel sglang-...whl``, ``wheel ...``), or why none could be had.
    origin: str

    @property
    def known(self) -> bool:
        return self.text is not None


def record_digest(data: bytes) -> str:
    """The ``sha256=...`` form pip writes into RECORD (urlsafe base64 without padding)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


class PristineSource:
    """Where one tree's pristine texts come from (git, RECORD, the cached release's wheel)."""

    def __init__(self, tree: SglangTree) -> None:
        self.tree = tree
        self._git_top = _git_toplevel(tree.package)
        self._record, self._records_seen = _find_record(tree.package)
        self._hashes = _read_record(self._record) if self._record else {}
        self._wheel: Path | None = None

    @property
    def offers(self) -> bool:
        """Whether any file of this tree can have a pristine text here (a checkout, a RECORD, a cached release)."""
        return self._git_top is not None or self._record is not None or self._cached_release()

    def describe(self) -> str:
        """What this tree offers, for the one line that says none of it applies."""
        try:
            cache = f"in {cache_dir() / 'releases'}"
        except PatchcraftError:
            cache = "in patchcraft's cache (none can be placed: set PATCHCRAFT_CACHE)"
        record = "has no dist-info RECORD listing its files beside it"
        if len(self._records_seen) > 1:
            names = ", ".join(r.parent.name for r in self._records_seen)
            record = (
                f"has {len(self._records_seen)} dist-info RECORDs listing its files beside it "
                f"({names}: one was installed over the other, so neither says what the files were)"
            )
        return f"{self.tree.package} is not a git checkout, {record} and is no release {cache}"

    def pristine(self, path: Path, candidates: Sequence[bytes] = ()) -> Pristine:
        """The pristine text of ``path`` (a file of this tree), or why it cannot be had.

        ``candidates``: bytes that may be it (the file with patchcraft's edits
        taken out); one matching the RECORD hash spares reading the wheel,
        so a patchcraft-patched install is judged offline.
        """
        if self._git_top is not None:
            found = self._from_git(path)
            if found is not None:
                return found
        member = _inside(path, self.tree.package.parent)
        if member is None:
            return Pristine(None, f"no pristine text: {path} is not inside {self.tree.package.parent}")
        if self._record is not None:
            return self._from_record(path, member, candidates)
        if self._cached_release():
            return self._from_wheel(path, member, "wheel {}")
        return Pristine(None, f"no pristine text: {self.describe()}")

    # -- git --------------------------------------------------------------

    def _from_git(self, path: Path) -> Pristine | None:
        assert self._git_top is not None
        rel = _inside(path, self._git_top)
        if rel is None:
            return None  # a symlink to a file outside the checkout: the other sources decide
        proc = _git(self._git_top, "show", f"HEAD:{rel}")
        if proc is None or proc.returncode != 0:
            return None  # not tracked at HEAD (an install inside a checkout): the other sources decide
        return Pristine(decode(path, proc.stdout).text, "git HEAD")

    # -- RECORD and wheel ---------------------------------------------------

    def _from_record(self, path: Path, member: str, candidates: Sequence[bytes]) -> Pristine:
        expected = self._hashes.get(member)
        assert self._record is not None
        if expected is None:
            return Pristine(None, f"no pristine text: {self._record} has no entry for {member}")
        for data in (path.read_bytes(), *candidates):
            if record_digest(data) == expected:
                return Pristine(decode(path, data).text, "RECORD")
        return self._from_wheel(path, member, "RECORD + wheel {}", expected)

    def _cached_release(self) -> bool:
        try:
            releases = (cache_dir() / "releases").resolve()
        except PatchcraftError:  # no cache can be placed (no HOME, no passwd entry): then no tree is in it
            return False
        package = self.tree.package.resolve()
        return package.name == "sglang" and package.parent.parent == releases

    def _from_wheel(self, path: Path, member: str, origin: str, expected: str | None = None) -> Pristine:
        wheel = self._wheel_path()
        try:
            with zipfile.ZipFile(wheel) as archive:
                data = archive.read(member)
        except KeyError:
            return Pristine(None, f"no pristine text: {wheel.name} has no {member}")
        except (OSError, zipfile.BadZipFile) as exc:
            raise PatchcraftError(f"{wheel}: cannot read the wheel ({exc})") from None
        if expected is not None and record_digest(data) != expected:
            raise PatchcraftError(
                f"{wheel.name}: {member} does not match {self._record}; the install is not that wheel's"
            )
        return Pristine(decode(path, data).text, origin.format(wheel.name))

    def _wheel_path(self) -> Path:
        """The release wheel of this tree's version, from the cache or downloaded now (one line on failure)."""
        if self._wheel is None:
            distribution, version = "sglang", str(self.tree.version)
            if self._record is not None:  # the installed distribution: sglang, or a fork's (sglang_kt-0.7.2.dist-info)
                distribution, version = _distribution(self._record.parent)
            wheels = cache_dir() / "wheels"
            self._wheel = find_wheel(wheels, version, distribution) or download_wheel(version, wheels, distribution)
        return self._wheel


def _find_record(package: Path) -> tuple[Path | None, tuple[Path, ...]]:
    """The RECORD beside ``package`` (site-packages) that lists the package's files, and every one that does.

    The distribution's name is not the package's: SGLang's is ``sglang``,
    a fork's may be ``sglang_kt`` (KTransformers' ``sglang-kt``) or
    ``lsglang``, each installing an ``sglang/`` package. A RECORD counts when
    it lists a file under ``<package>/``; two that do (one distribution
    installed over another) leave the files' origin unknown: no RECORD.
    """
    prefix = f"{package.name}/".encode()
    found = []
    for record in sorted(package.parent.glob("*.dist-info/RECORD")):
        if _lists(record, prefix):
            found.append(record)
    return (found[0] if len(found) == 1 else None), tuple(found)


def _lists(record: Path, prefix: bytes) -> bool:
    """Whether ``record`` has a line for a file under ``prefix`` (one byte search: a site-packages has hundreds)."""
    try:
        data = record.read_bytes()
    except OSError:
        return False  # an unreadable RECORD lists nothing we can use
    return data.startswith(prefix) or b"\n" + prefix in data


def _distribution(dist_info: Path) -> tuple[str, str]:
    """``(name, version)`` of a ``<name>-<version>.dist-info`` folder, the name as wheel files spell it."""
    name, _, version = dist_info.name.removesuffix(".dist-info").partition("-")
    return name, version


def _read_record(record: Path) -> dict[str, str]:
    """``member -> sha256=...`` of every hashed line of a RECORD (a CSV without quoting in practice)."""
    hashes: dict[str, str] = {}
    try:
        lines = record.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PatchcraftError(f"{record}: cannot read ({exc})") from None
    for line in lines:
        name, _, rest = line.rpartition(",")  # name,hash,size: the size is last
        name, _, digest = name.rpartition(",")
        if name and digest.startswith("sha256="):
            hashes[name] = digest
    return hashes


def _git(top: Path, *args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(["git", "-C", str(top), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no git here: a checkout cannot be read, the other sources decide


def _git_toplevel(package: Path) -> Path | None:
    """The work tree holding ``package``, when it lies in one (a checkout or fork)."""
    if not any((parent / ".git").exists() for parent in (package, *package.parents)):
        return None  # spare the subprocess: no repository above
    proc = _git(package, "rev-parse", "--show-toplevel")
    if proc is None or proc.returncode != 0:
        return None
    return Path(proc.stdout.decode("utf-8", "replace").strip()).resolve()


def _inside(path: Path, base: Path) -> str | None:
    """``path`` relative to ``base`` (``sglang/srt/models/x.py`` for a wheel or RECORD), or None.

    Resolved first (a tree reached through a symlinked folder), then as
    written: a model file that is a symlink to a file elsewhere keeps its
    place in the tree (the engine refuses that file itself, naming it).
    """
    for candidate, root in (
        (path.resolve(), base.resolve()),
        (Path(os.path.abspath(path)), Path(os.path.abspath(base))),
    ):
        try:
            return candidate.relative_to(root).as_posix()
        except ValueError:
            continue
    return None
