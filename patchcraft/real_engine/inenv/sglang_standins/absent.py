"""Placeholders for packages SGLang imports at module level on paths a text model never runs.

``torchvision`` is one: ``srt/multimodal/internvl_utils.py`` imports
``torchvision.transforms`` when ``srt/configs`` is imported, so the engine
cannot start without it, but the registry's torchvision builds are CUDA
builds whose op registrations fail against torch ``+cpu`` (``operator
torchvision::nms does not exist``). A placeholder package answers every
``import torchvision...`` and every attribute with a placeholder; calling
one raises, naming what was called, so a run that does need it stops there
with its name, never silently. transformers finds the package (its checks
ask ``importlib.util.find_spec``) at version ``0.0.0+patchcraft.placeholder``,
so its version-gated choices take the oldest path, and it imports from it
only what an image processor would call.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Optional, Sequence


VERSION = "0.0.0+patchcraft.placeholder"


class Placeholder:
    """Any attribute is another placeholder; calling one raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "Placeholder":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: a placeholder (patchcraft's CPU engine has no working {self._root()})")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # a class deriving from a placeholder derives from object

    def _root(self) -> str:
        return self._name.split(".")[0]

    def __repr__(self) -> str:
        return f"<placeholder {self._name}>"


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = tuple(roots)

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PlaceholderModule(spec.name, "patchcraft placeholder")
        module.__path__ = []
        if "." not in spec.name:
            setattr(module, "__version__", VERSION)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(roots: Sequence[str] = ("torchvision",)) -> list[str]:
    """Serve placeholders for ``roots`` (only those not importable for real); return those placed."""
    placed = []
    for root in roots:
        if root in sys.modules:
            continue
        try:
            __import__(root)
        except Exception:
            for name in [m for m in sys.modules if m == root or m.startswith(root + ".")]:
                del sys.modules[name]
            placed.append(root)
    if placed:
        sys.meta_path.insert(0, _Finder(placed))
    return placed


def serve_submodules(root: str) -> None:
    """Serve placeholder modules for ``root.<anything>`` (``root`` itself stays what it is)."""
    if not any(isinstance(f, _Finder) and root in f.roots for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder([root]))
