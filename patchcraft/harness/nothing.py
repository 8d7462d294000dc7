"""Nothing, the falsy stand-in for every SGLang helper the harness does not model, and where the code got one.

:class:`Nothing` is callable, an empty container, a no-op context manager
and never equal to anything; :class:`watch_standins` records the frame and
line that obtained each one, so a crash that acts on a stand-in's answer is
told from one in SGLang's own code. :class:`HarnessError` is the harness's
one error: the code under test took a path the harness cannot model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Nothing:
    """A falsy stand-in for an SGLang helper or setting.

    Calling it, reading an attribute or an item gives another Nothing; it
    is an empty container, a no-op context manager, never equal to
    anything, and an ``isinstance`` class that matches nothing. So
    ``get_global_server_args().enable_x`` is off, ``with recorder.with_current_layer(i):``
    does nothing, and a kernel-only branch is never taken.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str = "?") -> None:
        object.__setattr__(self, "_name", name)
        if _WATCH:
            _WATCH[-1].made(name)

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> "Nothing":
        return Nothing(f"{self._name}()")

    def __getattr__(self, name: str) -> "Nothing":
        if name.startswith("__"):
            raise AttributeError(name)
        return Nothing(f"{self._name}.{name}")

    def __setattr__(self, name: str, value: Any) -> None:
        pass

    def __getitem__(self, key: Any) -> "Nothing":
        return Nothing(f"{self._name}[...]")

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, item: Any) -> bool:
        return False

    def __enter__(self) -> "Nothing":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __eq__(self, other: Any) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __lt__(self, other: Any) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __or__(self, other: Any) -> "Nothing":
        return self

    __ror__ = __or__

    def __instancecheck__(self, obj: Any) -> bool:
        return False

    def __subclasscheck__(self, cls: Any) -> bool:
        return False


class HarnessError(Exception):
    """The code under test took a path the harness cannot model."""


#: This package's files: a frame in one of them is the harness, not the code under test.
HARNESS_DIR = str(Path(__file__).resolve().parent)


@dataclass(frozen=True)
class Made:
    """Where the code under test obtained a :class:`Nothing`: its frame, file and line."""

    frame: int  # id() of the frame
    filename: str
    line: int
    name: str


class StandInWatch:
    """Each :class:`Nothing` the code under test obtains, by the frame and line that asked for it.

    A crash on a line that obtained a Nothing (or reads one) acts on a
    stand-in's answer, not on a value SGLang produces (``with watch_standins() as seen:``).
    """

    def __init__(self) -> None:
        self.seen: list[Made] = []

    def made(self, name: str) -> None:
        frame = sys._getframe(2)  # past Nothing.__init__'s caller, which may be a stand-in itself
        while frame is not None and frame.f_code.co_filename.startswith(HARNESS_DIR):
            frame = frame.f_back  # type: ignore[assignment]
        if frame is not None and len(self.seen) < 100_000:
            self.seen.append(Made(id(frame), frame.f_code.co_filename, frame.f_lineno, name))


_WATCH: list[StandInWatch] = []


class watch_standins:
    """``with watch_standins() as seen:`` records every Nothing the code obtains while it runs."""

    def __enter__(self) -> StandInWatch:
        _WATCH.append(StandInWatch())
        return _WATCH[-1]

    def __exit__(self, *exc: Any) -> None:
        _WATCH.pop()


class UnknownIsNothing:
    """A stand-in whose other attributes are :class:`Nothing`, named ``<_prefix>.<name>``."""

    _prefix = "object"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Nothing(f"{self._prefix}.{name}")
