"""The model class graph across ``sglang/srt/models/``.

The unit of work is not a file but a *model*: a class that has
``set_eagle3_layers_to_capture`` (its own or inherited). Its three edit
sites may live in other files: the inner model's ``__init__`` and
``forward`` are often inherited (qwen3 -> qwen2, kimi_k25 ->
deepseek_v2). This module finds those sites with the standard ``ast``
module, which is fast; libcst is only used on the files that get edited.

Nothing here keys on a release number or a file name: only on structure.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Union

from patchcraft.errors import PatchcraftError
from patchcraft.sources import decode

SETTER = "set_eagle3_layers_to_capture"
MODELS_PACKAGE = "sglang.srt.models."
#: Cheap text filter: only files containing one of these are parsed up front.
RELEVANT = (b"layers_to_capture", SETTER.encode())

FunctionNode = Union[ast.FunctionDef, ast.AsyncFunctionDef]


@dataclass
class ClassNode:
    """One top-level class of one model file."""

    module: str
    name: str
    path: Path
    node: ast.ClassDef
    bases: list[str]
    methods: dict[str, FunctionNode]

    @property
    def key(self) -> tuple[str, str]:
        return (self.module, self.name)

    @property
    def label(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class EditSite:
    """Where one edit goes: a method of a class in a file, plus its parameters."""

    kind: str  # "init" | "setter" | "forward"
    path: Path
    module: str
    cls: str
    method: str
    params: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (str(self.path), self.cls, self.kind)

    def param(self, name: str) -> str | None:
        return dict(self.params).get(name)


@dataclass(frozen=True)
class ModelPlan:
    """What it takes to make layer id -1 work for one model class."""

    module: str
    cls: str
    path: Path
    sites: tuple[EditSite, ...] = ()
    unsupported: str | None = None
    delegate: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.module}.{self.cls}"

    @property
    def files(self) -> tuple[Path, ...]:
        seen: dict[Path, None] = {}
        for site in self.sites:
            seen.setdefault(site.path, None)
        return tuple(seen)


@dataclass
class ModelGraph:
    """Classes and imports of the model files, loaded on demand."""

    models_dir: Path
    classes: dict[tuple[str, str], ClassNode] = field(default_factory=dict)
    imports: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    loaded: dict[str, bool] = field(default_factory=dict)
    duplicates: dict[tuple[str, str], int] = field(default_factory=dict)

    # -- loading -----------------------------------------------------------
    def load(self, module: str, data: bytes | None = None) -> bool:
        """Parse ``<models_dir>/<module>.py`` with ``ast``; False if absent."""
        if module in self.loaded:
            return self.loaded[module]
        path = self.models_dir / f"{module}.py"
        if data is None:
            try:
                data = path.read_bytes()
            except OSError:
                self.loaded[module] = False
                return False
        source = decode(path, data)
        try:
            tree = ast.parse(source.text, filename=str(path))
        except SyntaxError as exc:
            raise PatchcraftError(
                f"{path}: syntax error at line {exc.lineno}: {exc.msg}; nothing was changed"
            ) from None
        self.loaded[module] = True
        self.imports[module] = _imports_of(tree)
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef):
                key = (module, stmt.name)
                if key in self.classes:
                    self.duplicates[key] = self.duplicates.get(key, 1) + 1
                self.classes[key] = ClassNode(
                    module=module,
                    name=stmt.name,
                    path=path,
                    node=stmt,
                    bases=[_dotted(b) for b in stmt.bases],
                    methods={
                        s.name: s
                        for s in stmt.body
                        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                    },
                )
        return True

    # -- resolution --------------------------------------------------------
    def resolve(self, module: str, name: str) -> ClassNode | None:
        """The class that ``name`` means inside ``module``, across files."""
        if not name:
            return None
        if "." in name:
            return None
        if (module, name) in self.classes:
            return self.classes[(module, name)]
        target = self.imports.get(module, {}).get(name)
        if target is None:
            return None
        other, other_name = target
        if other not in self.loaded:
            self.load(other)
        return self.classes.get((other, other_name))

    def mro(self, cls: ClassNode) -> list[ClassNode]:
        """A left-first linearisation of the bases known to the graph."""
        order: list[ClassNode] = []
        stack = [cls]
        seen: set[tuple[str, str]] = set()
        while stack:
            current = stack.pop(0)
            if current.key in seen:
                continue
            seen.add(current.key)
            order.append(current)
            bases = [self.resolve(current.module, b) for b in current.bases]
            stack = [b for b in bases if b is not None] + stack
        return order

    def find_method(self, cls: ClassNode, name: str) -> tuple[ClassNode, FunctionNode] | None:
        for owner in self.mro(cls):
            if name in owner.methods:
                return owner, owner.methods[name]
        return None

    def subclasses(self, cls: ClassNode) -> Iterator[ClassNode]:
        for other in list(self.classes.values()):
            if other is not cls and cls in self.mro(other)[1:]:
                yield other


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    if isinstance(node, ast.Subscript):  # Generic[T]
        return _dotted(node.value)
    return ""


def _imports_of(tree: ast.Module) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.ImportFrom) and stmt.module:
            module = stmt.module
            if stmt.level == 1 and "." not in module:
                module = MODELS_PACKAGE + module
            if not module.startswith(MODELS_PACKAGE):
                continue
            stem = module[len(MODELS_PACKAGE):]
            if "." in stem:
                continue
            for alias in stmt.names:
                found[alias.asname or alias.name] = (stem, alias.name)
    return found


# -- small structural queries ------------------------------------------------

def _is_self_attr(node: ast.AST, attr: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def _assigned_targets(func: FunctionNode) -> Iterator[tuple[ast.expr, Optional[ast.expr]]]:
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, (ast.Tuple, ast.List)):
                    for elt in target.elts:
                        yield elt, None
                else:
                    yield target, node.value
        elif isinstance(node, ast.AnnAssign):
            yield node.target, node.value


def assigns_self_attr(func: FunctionNode, attr: str) -> bool:
    return any(_is_self_attr(t, attr) for t, _ in _assigned_targets(func))


def class_assigns(graph: ModelGraph, cls: ClassNode, attr: str) -> bool:
    """Whether any ``__init__`` in the MRO of ``cls`` sets ``self.<attr>``."""
    for owner in graph.mro(cls):
        init = owner.methods.get("__init__")
        if init is not None and assigns_self_attr(init, attr):
            return True
    return False


def references_self_attr(func: FunctionNode, attr: str) -> bool:
    return any(_is_self_attr(n, attr) for n in ast.walk(func))


@dataclass(frozen=True)
class SetterShape:
    """What a setter does with its ids, read from its body."""

    param: str | None
    inner_attr: str | None = None
    delegate_attr: str | None = None
    variant: str = "plain"


def read_setter(func: FunctionNode) -> SetterShape:
    """Classify a ``set_eagle3_layers_to_capture`` body."""
    params = [a.arg for a in func.args.args[1:]] + [a.arg for a in func.args.kwonlyargs]
    param = params[0] if params else None
    if param is None:
        return SetterShape(param=None, variant="legacy")
    inner_attr = None
    for target, _ in _assigned_targets(func):
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "layers_to_capture"
            and _is_self_attr(target.value)
        ):
            inner_attr = target.value.attr  # type: ignore[attr-defined]
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == SETTER
            and _is_self_attr(node.func.value)
        ):
            attr = node.func.value.attr  # type: ignore[attr-defined]
            args = list(node.args) + [k.value for k in node.keywords]
            if len(args) == 1 and isinstance(args[0], ast.Name) and args[0].id == param:
                return SetterShape(param=param, delegate_attr=attr, variant="delegation")
            return SetterShape(param=param, inner_attr=attr, variant="inner-helper")
    if inner_attr is None:
        return SetterShape(param=param, variant="unknown")
    text = ast.dump(func)
    variant = "plain"
    if "Call(func=Name(id='max'" in text:
        variant = "max-heuristic"
    elif "Subscript(value=Name(id='%s'" % param in text:
        variant = "first-id-heuristic"
    return SetterShape(param=param, inner_attr=inner_attr, variant=variant)


def classes_assigned_to(graph: ModelGraph, outer: ClassNode, attr: str) -> list[ClassNode]:
    """Classes that ``self.<attr>`` is constructed from in the MRO's ``__init__``."""
    found: list[ClassNode] = []
    for owner in graph.mro(outer):
        init = owner.methods.get("__init__")
        if init is None:
            continue
        for target, value in _assigned_targets(init):
            if not (_is_self_attr(target, attr) and isinstance(value, ast.Call)):
                continue
            for cls in _constructed(graph, outer, owner, value):
                if cls not in found:
                    found.append(cls)
        if found:
            break
    return found


def _constructed(graph: ModelGraph, outer: ClassNode, owner: ClassNode, call: ast.Call) -> list[ClassNode]:
    name = _dotted(call.func)
    if name.startswith("self."):
        # self._init_model(...): the factory method that runs for ``outer``.
        found = graph.find_method(outer, name[len("self."):])
        if found is None:
            return []
        factory_owner, factory = found
        result = []
        for node in ast.walk(factory):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
                cls = graph.resolve(factory_owner.module, _dotted(node.value.func))
                if cls is not None:
                    result.append(cls)
        return result
    cls = graph.resolve(owner.module, name)
    return [cls] if cls is not None else []
