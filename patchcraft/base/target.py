"""Resolve what the user pointed at into an SGLang package tree.

A TARGET may be a model file, an ``sglang`` package directory, a checkout
or fork root containing ``python/sglang``, a directory containing an
``sglang`` package (site-packages), or nothing at all, in which case the
installed ``sglang`` is located with ``importlib.util.find_spec`` without
importing it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.sources import read_source
from patchcraft.base.tree_version import TreeVersion, VersionLabel, identify

MODELS = Path("srt") / "models"


@dataclass(frozen=True)
class SglangTree:
    """One SGLang package and the files the user asked about.

    ``root`` is the directory diff paths are relative to: the checkout
    root for a checkout, otherwise the directory holding ``sglang/``.
    ``only_files`` is empty for a whole tree, or the model files named.
    """

    package: Path
    root: Path
    only_files: tuple[Path, ...] = ()

    #: The serving engine whose tree this is (``base.vllm_tree.VllmTree`` says ``vllm``).
    engine = "sglang"

    @property
    def models_dir(self) -> Path:
        return self.package / MODELS

    @property
    def executor_dir(self) -> Path:
        return self.package / "srt" / "model_executor"

    @property
    def version_info(self) -> TreeVersion:
        """The version and where it came from: a version file, ``git describe``, the closest release (base.tree_version)."""
        return identify(self.package)

    @property
    def version(self) -> str:
        """The version as text shows it: ``0.5.10``, ``v0.5.10-3-gabc1234 (git describe)``, ``unknown (closest to ...)``.

        A :class:`~patchcraft.base.tree_version.VersionLabel`: it carries
        the record, so JSON built later still says what was read now.
        """
        return VersionLabel(self.version_info)

    @property
    def noun(self) -> str:
        """How advice names this tree: ``this release`` when a version file names it, else ``this tree``."""
        return self.version_info.noun

    def check_inside(self, path: Path) -> None:
        """Refuse to write ``path`` when it is a symlink leading outside the target root."""
        real = Path(os.path.realpath(path))
        for boundary in (self.root, self.package):
            if _is_within(real, Path(os.path.realpath(boundary))):
                return
        raise PatchcraftError(
            f"{path}: symlink to {real}, outside the target {self.root}; "
            "refusing to write through it (patch the real file's tree instead); nothing was changed"
        )

    def relative(self, path: Path) -> str:
        try:
            return path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return path.as_posix()


def _is_package(path: Path) -> bool:
    return (path / MODELS).is_dir()


def _is_within(path: Path, directory: Path) -> bool:
    try:
        path.relative_to(directory)
        return True
    except ValueError:
        return False


def _looks_like_sglang(models: Path) -> bool:
    """A models directory of SGLang's: its model files import ``sglang.srt``."""
    for candidate in sorted(models.glob("*.py"))[:400]:
        try:
            if b"sglang.srt" in candidate.read_bytes():
                return True
        except OSError:
            continue
    return False


def _sglang_or_refuse(target: str, package: Path) -> Path:
    """A package not named ``sglang`` must show SGLang's imports to be taken for one."""
    if package.name != "sglang" and not _looks_like_sglang(package / MODELS):
        raise PatchcraftError(
            f"{target}: not an SGLang tree ({package / MODELS} holds no model file importing sglang.srt)"
        )
    return package


def _package_of_file(path: Path) -> Path | None:
    for parent in path.resolve().parents:
        if _is_package(parent) and parent.name == "sglang":
            return parent
    return None


def _root_of_package(package: Path) -> Path:
    parent = package.parent
    if parent.name == "python" and (parent.parent / "python" / "sglang").is_dir():
        return parent.parent
    return parent


def resolve_target(target: str | None) -> SglangTree:
    """Turn one TARGET argument (or None) into an :class:`SglangTree`."""
    if target is None:
        return _installed()
    path = Path(target)
    if path.is_symlink() and not path.exists():
        raise PatchcraftError(f"{target}: broken symlink")
    if not path.exists():
        raise PatchcraftError(f"{target}: no such file or directory")
    if path.is_file():
        if path.suffix != ".py":
            raise PatchcraftError(f"{target}: not a Python file; expected an SGLang model file")
        read_source(path)  # empty, binary or undecodable: refused here, with its reason
        package = _package_of_file(path)
        if package is None:
            if path.parent.name == "models" and _looks_like_sglang(path.parent):
                # A loose models directory (e.g. a vendored copy): still a tree.
                return SglangTree(package=path.parent.parent.parent, root=path.parent, only_files=(path,))
            raise PatchcraftError(f"{target}: not inside an SGLang tree (expected .../sglang/srt/models/<file>.py)")
        return SglangTree(package=package, root=_root_of_package(package), only_files=(path.resolve(),))
    for candidate in (path, path / "python" / "sglang", path / "sglang"):
        if _is_package(candidate):
            package = _sglang_or_refuse(target, candidate.resolve())
            root = path.resolve() if candidate != path else _root_of_package(package)
            return SglangTree(package=package, root=root)
    if path.name == "models" and path.parent.name == "srt":
        package = _sglang_or_refuse(target, path.parent.parent.resolve())
        return SglangTree(package=package, root=_root_of_package(package))
    raise PatchcraftError(f"{target}: not an SGLang tree (no srt/models, python/sglang or sglang/ inside)")


def _installed() -> SglangTree:
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        package = Path(location)
        if _is_package(package):
            return SglangTree(package=package.resolve(), root=package.resolve().parent)
    raise PatchcraftError("no installed sglang found; pass a TARGET, or run `patchcraft fetch VERSION` first")
