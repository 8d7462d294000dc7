"""Which class vLLM serves for an architecture on each platform: ``vllm/models/<family>/__init__.py`` run.

From 0.22 vLLM's registry (``model_executor/models/registry.py``, the
text-generation and the multimodal tables) maps some architectures into a
package of their own, ``vllm/models/<family>/``, whose ``__init__.py``
picks a platform subpackage (``nvidia/``, ``amd/``, ``xpu/``, ``cpu/``,
``common/``) by ``current_platform``, or falls back to a class of
``model_executor/models/`` (0.32's ``deepseek_v32`` on CPU and XPU serves
``DeepseekV32ForCausalLM`` as ``deepseek_v2.DeepseekV3ForCausalLM``), or
refuses the platform (``raise NotImplementedError``). The shapes differ by
family: ``if``/``elif`` chains on ``is_cuda()``, ``is_rocm()``,
``is_xpu()``, ``is_cpu()`` or ``device_type``, ``TYPE_CHECKING`` guards,
a lazy module ``__getattr__``.

So the dispatch is read by **running** each family's ``__init__.py`` once
per platform, as the registry's import does: its own code, compiled at its
own lines, with ``current_platform`` a stand-in for that platform and every
import answered by a reference that records which module and name it took
(nothing of vLLM or torch is imported; ``TYPE_CHECKING`` is False, as at
run time). The name the registry asks for is then looked up in the
namespace (through the module's ``__getattr__`` when it has one), and the
reference followed to the file that defines the class. ``ast`` and the
standard library only.
"""

from __future__ import annotations

import ast
import builtins
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from patchcraft.reading.parsed import parse_python, statements
from patchcraft.base.sources import read_source

#: The platforms read, as vLLM names them (``current_platform.device_type``: ROCm's is "cuda" too).
PLATFORMS = ("cuda", "rocm", "xpu", "cpu")
_DEVICE_TYPE = {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "cpu": "cpu"}
#: vLLM's registry tables whose architectures a server can be given as its target.
TABLES = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS")
REGISTRY = Path("model_executor") / "models" / "registry.py"
MODELS_PREFIX = "vllm.model_executor.models."
_SAFE = (
    "abs all any bool dict enumerate frozenset getattr hasattr int isinstance len list max min object range "
    "repr set sorted str tuple zip True False None Exception AttributeError ImportError KeyError "
    "ModuleNotFoundError NotImplementedError RuntimeError TypeError ValueError"
).split()
#: Standard modules a family's ``__init__.py`` may import for real (nothing else is imported).
_REAL = {"typing": typing, "__future__": __import__("__future__")}


@dataclass(frozen=True)
class Served:
    """What vLLM serves for one architecture on one platform."""

    architecture: str
    platform: str
    #: The module the class is taken from (``vllm.models.deepseek_v32.nvidia.model``,
    #: ``vllm.model_executor.models.deepseek_v2``); "" when the platform is refused or not read.
    module: str = ""
    cls: str = ""
    #: The file defining the class (None when not found in the tree).
    path: Optional[Path] = None
    #: ``__init__.py:LINE`` of the import (or of the refusal) that decided it.
    where: str = ""
    #: Why this platform serves nothing: the family refuses it ("NotImplementedError: ..."), or its
    #: dispatch could not be followed here (said as such).
    refused: str = ""
    #: ``path`` relative to the package (``models/kimi_k3/nvidia/model.py``).
    file: str = ""

    @property
    def in_models(self) -> bool:
        """Whether the class is one of ``model_executor/models/`` (a fallback to the old model files)."""
        return self.module.startswith(MODELS_PREFIX)

    @property
    def stem(self) -> str:
        """``deepseek_v2`` for a class of ``model_executor/models/``."""
        return self.module[len(MODELS_PREFIX) :] if self.in_models else ""

    @property
    def subpackage(self) -> str:
        """The family's platform subpackage the class is in (``nvidia``, ``common``), "" for the family root."""
        parts = self.module.split(".")
        return parts[3] if len(parts) > 4 and parts[:2] == ["vllm", "models"] else ""


def read_tables(package: Path) -> dict[str, tuple[str, str]]:
    """``{architecture: (module, class)}`` of the registry's text-generation and multimodal tables."""
    path = package / REGISTRY
    if not path.is_file():
        return {}
    try:
        body = parse_python(read_source(path).text).body
    except (SyntaxError, ValueError):
        return {}
    found: dict[str, tuple[str, str]] = {}
    for node in body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = getattr(node, "value", None)
        if not isinstance(value, ast.Dict) or not any(isinstance(t, ast.Name) and t.id in TABLES for t in targets):
            continue
        for key, entry in zip(value.keys, value.values):
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(entry, ast.Tuple):
                parts = [e.value for e in entry.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(parts) >= 2:
                    found.setdefault(key.value, (parts[0], parts[1]))
    return found


def family_dispatch(package: Path, tables: Optional[dict[str, tuple[str, str]]] = None) -> list[Served]:
    """For every architecture the registry maps into ``vllm/models/``, what each platform serves."""
    tables = read_tables(package) if tables is None else tables
    found = []
    for name, (module, cls) in sorted(tables.items()):
        if module.startswith("vllm.models."):
            found.extend(served(package, name, module, cls))
    return found


def served(package: Path, architecture: str, module: str, cls: str) -> list[Served]:
    """What each of :data:`PLATFORMS` serves for ``architecture`` (``module``, ``cls`` from the registry)."""
    relative = Path(*module.split(".")[1:])
    init = package / relative / "__init__.py"
    if not init.is_file():  # a module, not a dispatching package: every platform takes it
        path = _defining(package, module, cls)
        return [
            Served(architecture, p, module, cls, path, f"{relative.as_posix()}.py", file=_relative(package, path))
            for p in PLATFORMS
        ]
    return [_run_init(package, init, module, architecture, cls, platform) for platform in PLATFORMS]


class _Refused(Exception):
    """What the stand-ins cannot answer: the platform's choice is not read here."""


class _Platform:
    """``current_platform`` for one platform: the queries vLLM's families ask of it."""

    def __init__(self, platform: str) -> None:
        self._platform = platform
        self.device_type = _DEVICE_TYPE[platform]
        self.device_name = platform

    def is_cuda(self) -> bool:
        return self._platform == "cuda"

    def is_rocm(self) -> bool:
        return self._platform == "rocm"

    def is_cuda_alike(self) -> bool:
        return self._platform in ("cuda", "rocm")

    def is_xpu(self) -> bool:
        return self._platform == "xpu"

    def is_cpu(self) -> bool:
        return self._platform == "cpu"

    def is_tpu(self) -> bool:
        return False

    def is_out_of_tree(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise _Refused(f"current_platform.{name} (not read for {self._platform})")


@dataclass(frozen=True)
class _Ref:
    """A module (or a name in one) that an import of the family's code took: recorded, never imported."""

    module: str
    name: str = ""
    line: int = 0

    def __getattr__(self, attr: str) -> "_Ref":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Ref(f"{self.module}.{self.name}" if self.name else self.module, attr, self.line)

    def __call__(self, *args: Any, **kwargs: Any) -> "_Ref":
        return self


class _Module:
    """The module object an ``import`` returns: its names are :class:`_Ref`, with the importing line."""

    def __init__(self, dotted: str, line: int, platform: str) -> None:
        self._dotted, self._line, self._platform = dotted, line, platform
        if dotted == "vllm.platforms" or dotted.startswith("vllm.platforms."):
            self.current_platform = _Platform(platform)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Ref(self._dotted, attr, self._line)


def _run_init(package: Path, init: Path, module: str, architecture: str, cls: str, platform: str) -> Served:
    relative = init.relative_to(package).as_posix()
    try:
        code = compile(read_source(init).text, str(init), "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OSError) as exc:
        return Served(architecture, platform, where=relative, refused=f"{relative} does not parse: {exc}")

    def importer(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        line = sys._getframe(1).f_lineno
        if level == 0 and name.split(".")[0] in _REAL:
            return _REAL[name.split(".")[0]]
        dotted = _absolute(module, name, level)
        if level == 0 and not fromlist:  # ``import a.b`` binds ``a``
            return _Module(dotted.split(".")[0], line, platform)
        return _Module(dotted, line, platform)

    namespace: dict[str, Any] = {
        "__builtins__": {**{n: getattr(builtins, n) for n in _SAFE}, "__import__": importer, "print": _quiet},
        "__name__": module,
        "__package__": module,
        "__file__": str(init),
    }
    try:
        exec(code, namespace)  # noqa: S102 - the release's own dispatch, on stand-ins
        value = namespace.get(cls)
        if value is None and callable(namespace.get("__getattr__")):
            value = namespace["__getattr__"](cls)
    except _Refused as exc:
        return Served(architecture, platform, where=relative, refused=f"not read: {exc}")
    except Exception as exc:  # the family refuses the platform (NotImplementedError) or fails on it
        line = _line_in(exc, str(init))
        return Served(
            architecture, platform, where=f"{relative}:{line}", refused=f"{type(exc).__name__}: {exc}".rstrip(": ")
        )
    if not isinstance(value, _Ref) or not value.name:
        return Served(architecture, platform, where=relative, refused=f"{relative} binds no {cls} on {platform}")
    path = _defining(package, value.module, value.name)
    return Served(
        architecture,
        platform,
        value.module,
        value.name,
        path,
        f"{relative}:{value.line}",
        file=_relative(package, path),
    )


def _relative(package: Path, path: Optional[Path]) -> str:
    return path.relative_to(package).as_posix() if path is not None else ""


def _absolute(module: str, name: str, level: int) -> str:
    if level == 0:
        return name
    base = module.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name]) if name else ".".join(base)


def _line_in(exc: BaseException, filename: str) -> int:
    trace, line = exc.__traceback__, 0
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == filename:
            line = trace.tb_lineno
        trace = trace.tb_next
    return line


def _quiet(*args: Any, **kwargs: Any) -> None:
    return None


def _defining(package: Path, module: str, cls: str, depth: int = 4) -> Optional[Path]:
    """The file of the tree that defines ``cls``, taken from ``module``: the module itself, or what its
    ``__init__.py`` imports it from (followed ``depth`` times)."""
    relative = Path(*module.split(".")[1:])
    for path in (package / relative.with_suffix(".py"), package / relative / "__init__.py"):
        if not path.is_file():
            continue
        try:
            tree = parse_python(read_source(path).text)
        except (SyntaxError, ValueError, OSError):
            return None
        if any(isinstance(n, ast.ClassDef) and n.name == cls for n in tree.body):
            return path
        if depth == 0:
            return None
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in statements(tree.body):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == cls:
                        source = _absolute(here, node.module or "", node.level) if node.level else node.module or ""
                        return _defining(package, source, alias.name, depth - 1)
        return None
    return None
