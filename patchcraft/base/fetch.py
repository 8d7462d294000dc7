"""Fetch an SGLang release's source: ``pip download --no-deps`` into a cache.

The wheel is kept in ``<cache>/wheels`` and its Python sources unpacked to
``<cache>/releases/<version>/sglang``. SGLang is never imported, never
installed, and never a dependency of patchcraft.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional

from patchcraft.base.cache_root import ensure_directory, root
from patchcraft.base.errors import PatchcraftError

_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")


def cache_dir() -> Path:
    """``$PATCHCRAFT_CACHE``, else ``$XDG_CACHE_HOME/patchcraft``, else ``~/.cache/patchcraft`` (:mod:`patchcraft.base.cache_root`)."""
    return root()


def find_wheel(wheels: Path, version: str, distribution: str = "sglang") -> Path | None:
    for candidate in sorted(wheels.glob(f"{distribution}-{version}-*.whl")):
        return candidate
    return None


def download_wheel(version: str, wheels: Path, distribution: str = "sglang") -> Path:
    """The cached wheel of ``distribution`` (SGLang) ``version``, downloaded with ``pip download --no-deps`` if not there yet.

    pip writes into a private staging directory and the finished wheel is
    moved into ``wheels`` with one ``os.replace``: a concurrent process
    (two ``patchcraft run`` launches on a fresh node, two CI jobs) sees the
    whole wheel or none, and two downloads of the same release each put an
    identical file in place.
    """
    found = find_wheel(wheels, version, distribution)
    if found:
        return found
    ensure_directory(wheels)
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=wheels))
    try:
        downloaded = pip_download(version, staging, distribution)
        final = wheels / downloaded.name
        os.replace(downloaded, final)
    except OSError as exc:
        raise PatchcraftError(
            f"{wheels}: cannot store the {distribution} {version} wheel ({exc.strerror or exc})"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def pip_download(version: str, into: Path, distribution: str = "sglang") -> Path:
    """``pip download --no-deps`` of ``distribution==version``'s wheel into ``into``; the wheel's path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-q",
        "-d",
        str(into),
        f"{distribution}=={version}",
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PatchcraftError(f"cannot run pip to download {distribution}=={version}: {exc}") from None
    found = find_wheel(into, version, distribution)
    if proc.returncode != 0 or found is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise PatchcraftError(f"pip could not download {distribution}=={version}: {last}")
    return found


def _sources(archive: zipfile.ZipFile, package: str = "sglang") -> list[str]:
    """The ``<package>/**.py`` members of a wheel: what patchcraft reads."""
    return [name for name in archive.namelist() if name.startswith(f"{package}/") and name.endswith(".py")]


def record(archive: zipfile.ZipFile) -> dict[str, str]:
    """``{member: "sha256=<urlsafe b64>"}`` from the wheel's ``*.dist-info/RECORD`` (empty if it has none)."""
    names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    if not names:
        return {}
    rows = archive.read(names[0]).decode("utf-8", "replace").splitlines()
    return {path: digest for path, digest, *_ in csv.reader(rows) if digest.startswith("sha256=")}


def digest(data: bytes) -> str:
    """A RECORD hash: ``sha256=`` and the urlsafe base64 digest without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def _check_against_record(wheel: Path, package: Path, names: list[str], record: dict[str, str]) -> None:
    """Every source file of ``package`` (``dest/sglang``) has the bytes the wheel's RECORD lists for it."""
    root = package.parent
    for name in names:
        try:
            data = (root / name).read_bytes()
        except OSError as exc:
            raise PatchcraftError(
                f"{root / name}: missing or unreadable in the unpacked release ({exc.strerror or exc}); "
                f"remove {package} and fetch again"
            ) from None
        expected = record.get(name)
        if expected is not None and digest(data) != expected:
            raise PatchcraftError(
                f"{root / name}: its bytes differ from {wheel.name}'s RECORD; remove {package} and fetch again"
            )


def unpack(wheel: Path, dest: Path, package_name: str = "sglang", ready: str = "srt/models") -> Path:
    """Unpack the ``sglang/`` Python sources of ``wheel`` into ``dest/sglang`` atomically; return ``dest/sglang``.

    ``package_name`` and ``ready`` (the folder whose presence means "unpacked")
    name another distribution's package (vLLM's: ``vllm``, ``model_executor/models``).

    Each file is checked against the wheel's RECORD (sha256) before the
    package is moved into place with one ``os.replace``. A concurrent unpack
    of the same release that got there first wins: its copy is checked the
    same way and returned, and this one's is thrown away.
    """
    package = dest / package_name
    if (package / ready).is_dir():
        return package
    ensure_directory(dest)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest))
    try:
        with zipfile.ZipFile(wheel) as archive:
            names, hashes = _sources(archive, package_name), record(archive)
            for name in names:
                archive.extract(name, staging)
        _check_against_record(wheel, staging / package_name, names, hashes)
        try:
            os.replace(staging / package_name, package)
        except OSError:
            if not (package / ready).is_dir():
                raise
            _check_against_record(wheel, package, names, hashes)  # the winner's copy
    except (OSError, zipfile.BadZipFile) as exc:
        raise PatchcraftError(
            f"{wheel}: cannot unpack ({getattr(exc, 'strerror', None) or exc}); "
            f"if the wheel is damaged, remove it and fetch again"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return package


def fetch(version: str, dest: Path | None = None, on_step: Optional[Callable[[str], None]] = None) -> Path:
    """Return the package root of SGLang ``version``, downloading it if needed.

    The package lands in ``<dest>/sglang``; by default ``dest`` is
    ``<cache>/releases/<version>``. ``on_step``: called with what starts
    (``downloading the wheel``, ``unpacking``) when there is work to do; a
    release already unpacked calls nothing.
    """
    if not _VERSION.match(version):
        raise PatchcraftError(f"{version!r} is not a release version (e.g. 0.5.10)")
    release = dest if dest is not None else cache_dir() / "releases" / version
    if (release / "sglang" / "srt" / "models").is_dir():
        return release / "sglang"
    wheels = cache_dir() / "wheels"
    if on_step is not None and find_wheel(wheels, version) is None:
        on_step("pip download --no-deps")  # one pip process: no byte count to show
    wheel = download_wheel(version, wheels)
    if on_step is not None:
        on_step("unpacking")
    return unpack(wheel, release)


#: The parts of an SGLang package patchcraft reads and patches (never the whole package: it is big).
PATCHED_PARTS = (
    "srt/models",
    "srt/model_executor",
    "srt/layers/aux_hidden_states.py",
    "version.py",
    "_version.py",
    "__init__.py",
)


def copy_parts(source: Path, package: Path, parts: tuple[str, ...] = PATCHED_PARTS) -> Path:
    """Copy ``parts`` (files or folders, relative to the package root) of ``source`` into ``package``.

    Parts a release does not have are skipped; ``__pycache__`` is never copied.
    """
    for part in parts:
        src = source / part
        if src.is_dir():
            shutil.copytree(src, package / part, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        elif src.is_file():
            (package / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, package / part)
    return package


def slim_wheel(wheel: Path, out: Path, keep: Callable[[str], bool]) -> Path:
    """Write ``out``: a zip of ``wheel``'s members that ``keep`` accepts and its RECORD restricted to them.

    Each kept member is checked against the wheel's RECORD first, so the
    slim archive holds only verified bytes; :func:`unpack` checks them again
    against the archive's own RECORD. It is written beside ``out`` and moved
    into place with one ``os.replace`` (a concurrent fetch sees all of it or
    none). Used for releases whose wheel is mostly compiled kernels (vLLM's
    is 400 MB; the Python patchcraft reads is a few MB).
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            hashes = record(archive)
            names = [n for n in archive.namelist() if keep(n)]
            records = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
            handle, temporary = tempfile.mkstemp(prefix=".slim-", suffix=".part", dir=out.parent)
            os.close(handle)
            try:
                with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as slim:
                    rows = []
                    for name in names:
                        data = archive.read(name)
                        expected = hashes.get(name)
                        if expected is not None and digest(data) != expected:
                            raise PatchcraftError(
                                f"{wheel}: {name} does not match the wheel's RECORD; remove the wheel and fetch again"
                            )
                        slim.writestr(name, data)
                        rows.append(f"{name},{expected or ''},{len(data)}")
                    if records:
                        slim.writestr(records[0], "\n".join(rows + [f"{records[0]},,"]) + "\n")
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(temporary, 0o666 & ~umask)  # as a downloaded file would be, not mkstemp's 0600
                os.replace(temporary, out)
            finally:
                if os.path.exists(temporary):
                    os.unlink(temporary)
    except (OSError, zipfile.BadZipFile) as exc:
        raise PatchcraftError(
            f"{wheel}: cannot read it into {out.name} ({getattr(exc, 'strerror', None) or exc}); "
            f"if the wheel is damaged, remove it and fetch again"
        ) from None
    return out
