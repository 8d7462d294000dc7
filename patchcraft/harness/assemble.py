"""Compile a model's classes from its files into stand-in classes that can run on a CPU.

A stand-in class has the real class's name and, as its methods, the
methods of the real class and of its bases in the model graph, compiled
from the file (the patched text, or its revert for the differential
check). Methods compile on first use; each file gets its own globals,
where every free name resolves to the real thing (``torch``, the standard
library, the release's ``aux_hidden_states``) or to a stand-in.

Instances start empty: only the *literal* ``self.x = ...`` statements of
the ``__init__`` methods run (``self.layers_to_capture = []``, the flag).
Other attributes ``__init__`` assigns read as :class:`Nothing`; an
attribute no ``__init__`` assigns raises ``AttributeError``, as it would
in SGLang, which is how a missing flag initialisation shows up.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import importlib.util
import types
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Optional

from torch import nn

from patchcraft.reading.class_graph import ClassNode, ModelGraph
from patchcraft.harness.extract import (
    ORIGINAL,
    MethodCode,
    ModelSource,
    global_names,
    init_attributes,
    literal_init,
    top_level_literals,
)
from patchcraft.harness.standins import HELPERS, Nothing, standin_import

#: Imports bound to the real module: plain Python and torch, nothing of SGLang.
REAL_MODULES = frozenset(
    {
        "torch",
        "typing",
        "typing_extensions",
        "contextlib",
        "math",
        "functools",
        "itertools",
        "collections",
        "dataclasses",
        "enum",
        "logging",
        "copy",
        "abc",
        "types",
        "warnings",
        "operator",
    }
)
AUX_MODULE = "sglang.srt.layers.aux_hidden_states"
_MISSING = object()
_OWNER = "__patchcraft_owner__"


def load_aux_module(package: Path) -> Optional[types.ModuleType]:
    """The release's own ``aux_hidden_states.py`` (plain torch), or None before it existed."""
    path = package / "srt" / "layers" / "aux_hidden_states.py"
    if not path.is_file():
        return None
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"patchcraft_harness_aux_{digest}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Sources:
    """Model files by path, each read and parsed once per run."""

    def __init__(self, package: Path, texts: Optional[Mapping[Path, str]] = None) -> None:
        self.package = package
        self._texts = {Path(p).resolve(): t for p, t in (texts or {}).items()}
        self._files: dict[Path, ModelSource] = {}
        self._aux: Any = _MISSING

    def get(self, path: Path) -> ModelSource:
        """The file at ``path``: its text in ``texts`` when given (a patch not yet written), else on disk."""
        if path not in self._files:
            text = self._texts.get(path.resolve())
            self._files[path] = _source(path, text if text is not None else ModelSource.read(path).text)
        return self._files[path]

    @property
    def aux(self) -> Optional[types.ModuleType]:
        if self._aux is _MISSING:
            self._aux = load_aux_module(self.package)
        return self._aux


@lru_cache(maxsize=64)
def _source(path: Path, text: str) -> ModelSource:
    """One parsed file per (path, text), shared by runs: its methods are extracted once."""
    return ModelSource(path=path, text=text)


class Program:
    """The classes of a model graph compiled from one variant (patched or original) of the files."""

    #: Whether the program runs one rank only (the first and last pipeline stage): see :func:`literal_init`.
    ONE_RANK = False

    def __init__(self, graph: ModelGraph, sources: Sources, variant: str) -> None:
        self.graph = graph
        self.sources = sources
        self.variant = variant
        self._globals: dict[Path, dict[str, Any]] = {}
        self._classes: dict[tuple[str, str], type] = {}
        self._methods: dict[tuple[Path, str, str], Optional[MethodCode]] = {}

    # -- source of one method, in this variant ------------------------------------
    def method(self, owner: ClassNode, name: str) -> Optional[MethodCode]:
        key = (owner.path, owner.name, name)
        if key not in self._methods:
            found = self.sources.get(owner.path).method(owner.name, name)
            if found is not None and self.variant == ORIGINAL:
                found = found.reverted()
            self._methods[key] = found
        return self._methods[key]

    # -- globals ------------------------------------------------------------------
    def globals_for(self, path: Path) -> dict[str, Any]:
        if path not in self._globals:
            self._globals[path] = {
                "__builtins__": builtins,
                "__name__": f"sglang.srt.models.{path.stem}",
                "__file__": str(path),
            }
        return self._globals[path]

    def _resolve(self, name: str, source: ModelSource) -> Any:
        """What free ``name`` of ``source`` stands for; ``_MISSING`` leaves it to builtins (or NameError)."""
        binding = source.imports.get(name)
        if binding is None and name not in source.defined:
            return _MISSING  # a builtin, or a NameError as in SGLang itself
        if name in HELPERS:
            return HELPERS[name]()
        if binding is not None:
            module, attr = binding
            standin = standin_import(module, attr)
            if standin is not None:
                return standin
            if module == AUX_MODULE:
                aux = self.sources.aux
                return getattr(aux, attr or "", Nothing(name)) if aux is not None else Nothing(name)
            if module.split(".")[0] in REAL_MODULES:
                try:
                    imported = importlib.import_module(module)
                    return getattr(imported, attr) if attr else imported
                except (ImportError, AttributeError):
                    return Nothing(name)
        return Nothing(name)

    def function(self, method: MethodCode, owner: Optional[type] = None) -> types.FunctionType:
        """Compile ``method`` with its free names resolved in its file's globals.

        The method is compiled inside a class body, as in the file, so a
        zero-argument ``super()`` works; its ``__class__`` is then ``owner``.
        """
        func_node = method.tree().body[0]
        wrapper = ast.ClassDef(name=_OWNER, bases=[], keywords=[], body=[func_node], decorator_list=[])
        ast.copy_location(wrapper, func_node)
        wrapper.end_lineno, wrapper.end_col_offset = func_node.end_lineno, func_node.end_col_offset
        flags = self.sources.get(method.path).future_flags
        code = compile(
            ast.Module(body=[wrapper], type_ignores=[]), str(method.path), "exec", flags=flags, dont_inherit=True
        )
        func = self._define(method.path, code, _OWNER, f"{method.cls}.{method.name}").__dict__[method.name]
        func.__qualname__ = f"{method.cls}.{method.name}"
        if owner is not None and "__class__" in func.__code__.co_freevars:
            func.__closure__[func.__code__.co_freevars.index("__class__")].cell_contents = owner
        return func

    def _define(self, path: Path, code: types.CodeType, name: str, qualname: str) -> Any:
        namespace = self.globals_for(path)
        source = self.sources.get(path)
        for free in global_names(code):
            if free not in namespace:
                value = self._resolve(free, source)
                if value is not _MISSING:
                    namespace[free] = value
        saved = namespace.get(name, _MISSING)
        exec(code, namespace)
        defined = namespace[name]
        if saved is _MISSING:
            del namespace[name]
        else:
            namespace[name] = saved
        if isinstance(defined, types.FunctionType):
            defined.__qualname__ = qualname
        return defined

    # -- classes ------------------------------------------------------------------
    def stand_in(self, node: ClassNode) -> type:
        """The stand-in class for ``node`` (cached); its bases mirror the model graph."""
        if node.key not in self._classes:
            self._classes[node.key] = self._build(node)
        return self._classes[node.key]

    def _build(self, node: ClassNode) -> type:
        bases = [self.graph.resolve(node.module, b) for b in node.bases]
        parents = tuple(self.stand_in(b) for b in bases if b is not None) or (StandInModule,)
        namespace: dict[str, Any] = dict(self.sources.get(node.path).class_literals(node.name))
        for name in node.methods:
            if not (name.startswith("__") and name.endswith("__")):
                namespace[name] = _LazyMethod(self, node, name)
        attributes: set[str] = set()
        top_level: set[str] = set()
        init = self.method(node, "__init__")
        literals = None
        if init is not None:
            attributes = init_attributes(init)
            top_level = top_level_literals(init)
            code = literal_init(init, one_rank=self.ONE_RANK)
            if code is not None:
                literals = self._define(node.path, code, "__init_literals__", f"{node.name}.__init__")
        namespace["_standin_own_attributes"] = frozenset(attributes)
        namespace["_standin_own_top_level"] = frozenset(top_level)
        namespace["_standin_own_init"] = literals
        namespace["__module__"] = f"sglang.srt.models.{node.module}"
        try:
            return type(node.name, parents, namespace)
        except TypeError:  # an MRO the stand-ins cannot reproduce: flatten to the first base
            return type(node.name, parents[:1], namespace)


class _LazyMethod:
    """A method compiled on first access, then put in its class in its place."""

    def __init__(self, program: Program, owner: ClassNode, name: str) -> None:
        self.program, self.owner, self.name = program, owner, name
        self.cls: Optional[type] = None

    def __set_name__(self, cls: type, name: str) -> None:
        self.cls = cls

    def resolve(self) -> Any:
        method = self.program.method(self.owner, self.name)
        assert method is not None, (self.owner.label, self.name)
        func: Any = self.program.function(method, self.cls)
        decorators = {d.split("(")[0].split(".")[-1] for d in method.decorators}
        if decorators & {"property", "cached_property"}:
            return property(func)
        if "staticmethod" in decorators:
            return staticmethod(func)
        if "classmethod" in decorators:
            return classmethod(func)
        return func

    def __get__(self, instance: Any, owner: type) -> Any:
        member = self.resolve()
        setattr(self.cls, self.name, member)
        return getattr(instance, self.name) if instance is not None else getattr(owner, self.name)


class StandInModule(nn.Module):
    """Base of every stand-in class; see the module docstring for attribute rules."""

    _standin_own_attributes: frozenset = frozenset()
    _standin_own_init: Any = None

    def __init__(self) -> None:
        super().__init__()
        for cls in reversed(type(self).__mro__):
            init = cls.__dict__.get("_standin_own_init")
            if init is not None:
                init(self)

    @classmethod
    def sets_unconditionally(cls, name: str) -> bool:
        """Whether an ``__init__`` of the real class sets ``self.<name>`` to a literal at its top level."""
        return any(name in klass.__dict__.get("_standin_own_top_level", ()) for klass in cls.__mro__)

    @classmethod
    def assigns(cls, name: str) -> bool:
        """Whether an ``__init__`` of the real class (or its bases) assigns ``self.<name>``."""
        return any(name in klass.__dict__.get("_standin_own_attributes", ()) for klass in cls.__mro__)

    def equip(self, name: str, value: Any) -> None:
        """Set a part the harness provides, but only where the real ``__init__`` sets it too.

        A forward reading an attribute its class never assigns must raise
        ``AttributeError`` here as in SGLang, not find a helpful stand-in.
        ``_name`` counts as well: ``self._start_layer`` behind a
        ``start_layer`` property.
        """
        for attr in (name, f"_{name}"):
            if type(self).assigns(attr):
                setattr(self, attr, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if type(self).assigns(name):
                return Nothing(f"self.{name}")
            raise
