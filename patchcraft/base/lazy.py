"""Imports deferred to first use, so a command loads only what it needs.

libcst and the transforms cost about 0.15 s to import. A run answered from
the result cache (:mod:`patchcraft.engine.result_cache`), ``--help`` and ``list`` never
touch them, so the engine names them through :class:`Deferred` stand-ins
that import on first use and then behave as the real object would for the
uses the engine makes of them: attributes, calls, indexing, iteration.
"""

from __future__ import annotations

import importlib
from typing import Any, Iterator

_UNSET = object()


class Deferred:
    """``module`` (or ``module.attr``), imported the first time it is used."""

    __slots__ = ("_module", "_attr", "_target")

    def __init__(self, module: str, attr: str | None = None) -> None:
        self._module = module
        self._attr = attr
        self._target: Any = _UNSET

    def resolve(self) -> Any:
        """The real object (imported now if it was not yet)."""
        if self._target is _UNSET:
            target = importlib.import_module(self._module)
            self._target = getattr(target, self._attr) if self._attr else target
        return self._target

    def __getattr__(self, name: str) -> Any:
        # Only called for names not in __slots__: the real object's attributes.
        return getattr(self.resolve(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __getitem__(self, key: Any) -> Any:
        return self.resolve()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.resolve())

    def __len__(self) -> int:
        return len(self.resolve())

    def __contains__(self, item: Any) -> bool:
        return item in self.resolve()

    def __repr__(self) -> str:
        name = f"{self._module}.{self._attr}" if self._attr else self._module
        state = "loaded" if self._target is not _UNSET else "not loaded yet"
        return f"<deferred {name} ({state})>"
