"""Fetch a vLLM release's Python: ``pip download --no-deps vllm==X``, kept slim.

A vLLM wheel is 240-430 MB, almost all compiled kernels. patchcraft reads
a few MB of its Python: the model files, the runners that set the aux layer
ids, the speculative config (its model-type gate), the draft config classes
and the version. So the wheel is downloaded into a private staging
directory, those members are checked against its RECORD and written to a
slim archive ``<cache>/wheels/vllm-<version>.slim<revision>.zip`` (with
their RECORD rows; the revision of :data:`PARTS` is in the name), and the
wheel is deleted. The slim archive is unpacked like an
SGLang wheel (:func:`patchcraft.base.fetch.unpack`: RECORD-checked, one
``os.replace``) into ``<cache>/releases/vllm-<version>/vllm``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

from patchcraft.base.cache_root import ensure_directory, remove_quietly
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.fetch import _VERSION, cache_dir, pip_download, slim_wheel, unpack

DISTRIBUTION = "vllm"
#: The folder whose presence means a release is unpacked.
READY = "model_executor/models"
#: The Python parts of a vLLM package patchcraft reads (folders end with "/").
PARTS = (
    "__init__.py",
    "_version.py",
    "version.py",
    "envs.py",
    "model_executor/models/",
    "models/",
    "model_executor/layers/layernorm.py",
    "v1/worker/gpu_model_runner.py",
    "v1/worker/gpu_worker.py",
    "v1/worker/gpu/",
    "v1/spec_decode/",
    "config.py",
    "config/speculative.py",
    "config/__init__.py",
    "config/vllm.py",
    "transformers_utils/configs/eagle.py",
    "transformers_utils/configs/speculators/",
    "platforms/",
    # Which fused add-norm runs, and whether in place, per platform and compilation setting
    # (reading.vllm_norm_dispatch): the custom-op switch, the IR ops and their kernels, the configs that pick them.
    "model_executor/custom_op.py",
    "ir/",
    "kernels/",
    "_custom_ops.py",
    "config/kernel.py",
    "config/compilation.py",
)


def kept(member: str) -> bool:
    """Whether a wheel member is one of :data:`PARTS` (Python files only)."""
    if not member.startswith(f"{DISTRIBUTION}/") or not member.endswith(".py"):
        return False
    inside = member[len(DISTRIBUTION) + 1 :]
    return any(inside == part or (part.endswith("/") and inside.startswith(part)) for part in PARTS)


#: Bumped whenever :data:`PARTS` changes: an archive or an unpacked release of another revision is made again.
#: 2: ``config/vllm.py`` (``VllmConfig.use_v2_model_runner``, which picks the default runner from 0.33).
#: 3: ``platforms/``, ``ir/``, ``kernels/``, ``model_executor/custom_op.py``, ``_custom_ops.py``, ``config/kernel.py``,
#: ``config/compilation.py`` (the norm's dispatch per platform and compilation setting).
PARTS_REVISION = 3
#: The file in an unpacked release that names its revision.
MARKER = "PATCHCRAFT_PARTS"


def slim_name(version: str, revision: int = PARTS_REVISION) -> str:
    return f"{DISTRIBUTION}-{version}.slim{revision if revision > 1 else ''}.zip"


def find_slim(wheels: Path, version: str) -> Optional[Path]:
    path = wheels / slim_name(version)
    return path if path.is_file() else None


def slim_archive(version: str, wheels: Path) -> Path:
    """The cached slim archive of vLLM ``version``, made now from a downloaded wheel if not there yet."""
    found = find_slim(wheels, version)
    if found is not None:
        return found
    ensure_directory(wheels)
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=wheels))
    try:
        wheel = pip_download(version, staging, DISTRIBUTION)
        made = slim_wheel(wheel, wheels / slim_name(version), kept)
        for older in range(1, PARTS_REVISION):
            remove_quietly(wheels / slim_name(version, older))
        return made
    except OSError as exc:
        raise PatchcraftError(f"{wheels}: cannot store the vllm {version} sources ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def release_dir(version: str) -> Path:
    return cache_dir() / "releases" / f"{DISTRIBUTION}-{version}"


def fetch_vllm(version: str, dest: Optional[Path] = None, on_step: Optional[Callable[[str], None]] = None) -> Path:
    """The package root of vLLM ``version`` (``<dest>/vllm``; by default ``<cache>/releases/vllm-<version>``)."""
    if not _VERSION.match(version):
        raise PatchcraftError(f"{version!r} is not a release version (e.g. 0.18.0)")
    release = dest if dest is not None else release_dir(version)
    if (release / DISTRIBUTION / READY).is_dir():
        if _revision(release) == PARTS_REVISION:
            return release / DISTRIBUTION
        _set_aside(release)  # unpacked with other PARTS: unpacked again
    wheels = cache_dir() / "wheels"
    if on_step is not None and find_slim(wheels, version) is None:
        on_step("pip download --no-deps (the wheel is kept only until its Python is read)")
    archive = slim_archive(version, wheels)
    if on_step is not None:
        on_step("unpacking")
    package = unpack(archive, release, DISTRIBUTION, READY)
    _write_revision(release)
    os.utime(archive)  # most recently used, for a future prune
    return package


def _revision(release: Path) -> int:
    try:
        return int((release / MARKER).read_text().strip())
    except (OSError, ValueError):
        return 0


def _write_revision(release: Path) -> None:
    handle, temporary = tempfile.mkstemp(prefix=".parts-", dir=release)
    with os.fdopen(handle, "w") as out:
        out.write(f"{PARTS_REVISION}\n")
    os.replace(temporary, release / MARKER)


def _set_aside(release: Path) -> None:
    """Move a stale unpacked package out of the way (one rename), then remove it."""
    stale = release / f".stale-{os.getpid()}"
    try:
        os.replace(release / DISTRIBUTION, stale)
    except OSError:
        return  # another fetch moved it first
    shutil.rmtree(stale, ignore_errors=True)
