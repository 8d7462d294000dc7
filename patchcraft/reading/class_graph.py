"""The model class graph across ``sglang/srt/models/``.

The unit of work is not a file but a *model*: a class that has
``set_eagle3_layers_to_capture`` (its own or inherited). Its three edit
sites may live in other files: the inner model's ``__init__`` and
``forward`` are often inherited (qwen3 -> qwen2, kimi_k25 ->
deepseek_v2). This module reads the classes, their bases and imports,
and answers the structural questions planning asks to find those sites
(:mod:`patchcraft.planning.model_plans`), with the standard ``ast`` module,
which is fast; libcst is only used on the files that get edited. The
records planning returns (``EditSite``, ``ModelPlan``) are in
:mod:`patchcraft.planning.records`.

Nothing here keys on a release number or a file name: only on structure.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Union

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.sources import decode
from patchcraft.reading.parsed import parse_python  # noqa: F401 - planning's readers import it from here

SETTER = "set_eagle3_layers_to_capture"
#: The attribute patchcraft adds to an inner model: its ``forward`` captures the embedding output.
FLAG = "capture_embedding_for_eagle3"
#: Keywords through which a forward hands its collector to the layers.
CAPTURE_KEYWORDS = ("captured_last_layer_outputs", "capture_output")
MODELS_PACKAGE = "sglang.srt.models."
#: Cheap text filter: only files containing one of these are parsed up front.
RELEVANT = (SETTER.encode(),)

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


class SiteParams:
    """The parameters of one edit kind: each kind has a frozen dataclass that derives from this.

    The model kinds' and the edit-site record that carries them are planning's
    (:mod:`patchcraft.planning.records`); the runner's (``PassIds``,
    ``RememberIds``) are in :mod:`patchcraft.planning.runner_edits`, and
    ``fusion-mark``'s (``MarkParams``) in :mod:`patchcraft.reading.fusion_reading`.
    """

    __slots__ = ()


@dataclass
class ModelGraph:
    """Classes and imports of the model files, loaded on demand."""

    models_dir: Path
    classes: dict[tuple[str, str], ClassNode] = field(default_factory=dict)
    imports: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    #: ``from sglang.srt.models import qwen3_5`` -> {"qwen3_5": "qwen3_5"} per module.
    module_imports: dict[str, dict[str, str]] = field(default_factory=dict)
    loaded: dict[str, bool] = field(default_factory=dict)
    duplicates: dict[tuple[str, str], int] = field(default_factory=dict)
    #: :func:`patchcraft.planning.model_plans.plan_model`'s results, per (class key, delegation depth):
    #: a class is planned once.
    plans: dict = field(default_factory=dict)

    # -- loading -----------------------------------------------------------
    def load(self, module: str, data: bytes | None = None) -> bool:
        """Parse ``<models_dir>/<module>.py`` with ``ast``; False if absent."""
        if module in self.loaded:
            return self.loaded[module]
        path = self.path_of(module)
        if data is None:
            try:
                data = path.read_bytes()
            except OSError:
                self.loaded[module] = False
                return False
        source = decode(path, data)
        try:
            tree = parse_python(source.text)
        except SyntaxError as exc:
            raise PatchcraftError(
                f"{path}: syntax error at line {exc.lineno}: {exc.msg}; nothing was changed"
            ) from None
        self.loaded[module] = True
        self.imports[module], self.module_imports[module] = _imports_of(tree)
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
                    methods={s.name: s for s in stmt.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))},
                )
        return True

    def path_of(self, module: str) -> Path:
        """The file of ``module`` (a model file's stem; vLLM's graph adds its ``vllm/models/`` files)."""
        return self.models_dir / f"{module}.py"

    # -- resolution --------------------------------------------------------
    def resolve(self, module: str, name: str) -> ClassNode | None:
        """The class that ``name`` means inside ``module``, across files."""
        if not name:
            return None
        if "." in name:
            # ``qwen3_5.Qwen3_5ForCausalLM`` through ``from sglang.srt.models import qwen3_5``
            head, _, rest = name.partition(".")
            other = self.module_imports.get(module, {}).get(head)
            if other is None or "." in rest or not self.load(other):
                return None
            return self.resolve(other, rest)
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


def _statements(tree: ast.Module) -> Iterator[ast.stmt]:
    """Every statement, in defs and compound statements too, but no expression nodes.

    Imports may sit inside a method (mllama4 imports Llama4ForCausalLM in
    ``__init__``); walking statements only is far cheaper than ``ast.walk``.
    """
    stack: list = list(reversed(tree.body))
    while stack:
        stmt = stack.pop()
        yield stmt
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(stmt, name, None)
            if isinstance(block, list):
                stack.extend(reversed(block))


def _imports_of(tree: ast.Module) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """Names imported from sibling model files, and sibling modules imported whole."""
    found: dict[str, tuple[str, str]] = {}
    modules: dict[str, str] = {}
    package = MODELS_PACKAGE.rstrip(".")
    for stmt in _statements(tree):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                stem = alias.name[len(MODELS_PACKAGE) :] if alias.name.startswith(MODELS_PACKAGE) else ""
                if stem and "." not in stem and alias.asname:
                    modules[alias.asname] = stem
            continue
        if not isinstance(stmt, ast.ImportFrom):
            continue
        module = stmt.module or ""
        if stmt.level == 1:
            module = f"{MODELS_PACKAGE}{module}" if module else package
        if module == package:  # from sglang.srt.models import qwen3_5
            for alias in stmt.names:
                modules[alias.asname or alias.name] = alias.name
            continue
        if not module.startswith(MODELS_PACKAGE):
            continue
        stem = module[len(MODELS_PACKAGE) :]
        if "." in stem:
            continue
        for alias in stmt.names:
            found[alias.asname or alias.name] = (stem, alias.name)
    return found, modules


# -- small structural queries ------------------------------------------------


@functools.lru_cache(maxsize=8192)
def nodes_of(node: ast.AST) -> tuple[ast.AST, ...]:
    """Every node under ``node``, in ``ast.walk`` order, walked once.

    Planning asks many questions of the same methods (does ``__init__`` set
    this attribute, does ``forward`` name that one): walking the tree anew
    for each was most of the time
    :func:`patchcraft.planning.model_plans.plan_models` took. Nobody
    modifies these trees (see :func:`parse_python`).
    """
    return tuple(ast.walk(node))


def _is_self_attr(node: ast.AST, attr: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def _assigned_targets(func: FunctionNode) -> Iterator[tuple[ast.expr, Optional[ast.expr]]]:
    for node in nodes_of(func):
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
    return any(_is_self_attr(n, attr) for n in nodes_of(func))


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
        if isinstance(target, ast.Attribute) and target.attr == "layers_to_capture" and _is_self_attr(target.value):
            inner_attr = target.value.attr  # type: ignore[attr-defined]
    for node in nodes_of(func):
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
        own = assigns_self_attr(func, "layers_to_capture")
        return SetterShape(param=param, variant="own-helper" if own else "unknown")
    variant = "plain"
    nodes = nodes_of(func)
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "max" for n in nodes):
        variant = "max-heuristic"
    elif any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == param for n in nodes):
        variant = "first-id-heuristic"
    return SetterShape(param=param, inner_attr=inner_attr, variant=variant)


def group_of(func: FunctionNode, rank_attr: str) -> str:
    """The pipeline group a method tests, e.g. ``get_pp_group()`` in ``get_pp_group().is_last_rank``."""
    for node in nodes_of(func):
        if isinstance(node, ast.Attribute) and node.attr == rank_attr:
            return ast.unparse(node.value)
    return ""


@dataclass(frozen=True)
class ForwardShape:
    """How an inner model's ``forward`` captures aux hidden states (for reports and docs)."""

    collector: str = "none"  # list | AuxHiddenStateList | AuxHiddenStatePacker | ...
    styles: tuple[str, ...] = ()
    residual: bool = True
    tbo: bool = False
    post_loop: bool = False
    loops: int = 0
    #: The loops capture only layers flagged ``_is_layer_to_capture`` (never by id).
    flag_gated_only: bool = False

    def labels(self) -> list[str]:
        labels = [f"collector {self.collector}", *self.styles]
        if not self.residual:
            labels.append("no local residual")
        if self.loops > 1:
            labels.append(f"{self.loops} capture loops")
        if self.post_loop:
            labels.append("post-loop capture")
        if self.tbo:
            labels.append("two-batch-overlap path")
        return labels


@functools.lru_cache(maxsize=256)
def read_forward(func: FunctionNode) -> ForwardShape:
    """Classify the capture of an inner model's ``forward`` (``ast`` only, no edits)."""
    capture_loops = [node for node in _outer_loops(func) if _loop_captures(node)]
    styles: list[str] = []
    names: set[str] = set()
    for loop in capture_loops:
        for node in nodes_of(loop):
            if isinstance(node, ast.keyword) and node.arg in CAPTURE_KEYWORDS:
                gate = "flag-gated" if "_is_layer_to_capture" in words_of(node.value) else "id-gated"
                styles.append(f"collector into layers ({node.arg}=, {gate})")
                names.update(n.id for n in nodes_of(node.value) if isinstance(n, ast.Name))
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in ("append", "capture")
                and isinstance(node.value, ast.Name)
            ):
                names.add(node.value.id)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if node.func.attr == "append" and isinstance(node.func.value, ast.Name):
                    styles.append(f"append in loop ({_expression_kind(node.args[0])})")
                elif node.func.attr == "capture" and isinstance(node.func.value, ast.Name):
                    styles.append("aux.capture() in loop")
    collector = "none"
    for target, value in _assigned_targets(func):
        if isinstance(target, ast.Name) and target.id in names:
            if isinstance(value, ast.List):
                collector = "list"
                break
            if isinstance(value, ast.Call):
                collector = _dotted(value.func).split(".")[0] or "call"
                break
    nodes = nodes_of(func)
    ifs = [n for n in nodes if isinstance(n, ast.If)]
    # patchcraft's own capture (``if self.capture_embedding_for_eagle3 ...``) is no shape of the release
    inside = {id(n) for block in capture_loops for n in nodes_of(block)}
    inside |= {id(n) for block in ifs if FLAG in words_of(block.test) for n in nodes_of(block)}
    post_loop = any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("append", "capture")
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id in names
        and id(n) not in inside
        for n in nodes
    )
    return ForwardShape(
        collector=collector,
        styles=tuple(dict.fromkeys(styles)),
        residual=any(isinstance(t, ast.Name) and t.id == "residual" for t, _ in _assigned_targets(func)),
        tbo=any("can_run_tbo" in words_of(n.test) for n in ifs),
        post_loop=post_loop,
        loops=len(capture_loops),
        flag_gated_only=bool(capture_loops)
        and all(
            "layers_to_capture" not in words_of(loop) and "_is_layer_to_capture" in words_of(loop)
            for loop in capture_loops
        ),
    )


def words_of(node: ast.AST) -> set[str]:
    """Names, attribute names and string constants under ``node`` (cheaper than ``ast.dump``)."""
    found: set[str] = set()
    for child in nodes_of(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            found.add(child.value)
    return found


def _outer_loops(func: FunctionNode) -> list[ast.For]:
    """``for`` statements of ``func`` not nested in another ``for`` (nor in nested defs)."""
    found: list[ast.For] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(child, ast.For):
                found.append(child)
                continue
            visit(child)

    visit(func)
    return found


def _loop_captures(loop: ast.For) -> bool:
    return not words_of(loop).isdisjoint(("layers_to_capture", "_is_layer_to_capture"))


def _expression_kind(expr: ast.expr) -> str:
    if isinstance(expr, ast.Name):
        return "bare hidden_states" if expr.id == "hidden_states" else f"a local, {expr.id}"
    if isinstance(expr, ast.IfExp):
        return "None-safe, not cloned"
    if isinstance(expr, ast.BinOp):
        return "hidden_states + residual"
    if isinstance(expr, ast.Call):
        return ast.unparse(expr.func) + "()"
    return type(expr).__name__


def classes_assigned_to(graph: ModelGraph, outer: ClassNode, attr: str) -> list[ClassNode]:
    """Classes that ``self.<attr>`` is constructed from in the MRO's ``__init__``."""
    return constructors_of(graph, outer, attr)[0]


def constructors_of(graph: ModelGraph, outer: ClassNode, attr: str) -> tuple[list[ClassNode], list[str]]:
    """Classes ``self.<attr>`` is built from, and the constructor calls that name no class.

    The most derived ``__init__`` that assigns ``self.<attr>`` wins (a subclass
    replacing ``self.model`` after ``super().__init__()``). A constructor may be
    a class, a factory method, a class attribute (``self.body_cls(...)``) or an
    ``__init__`` parameter with a class default (``language_model_cls=...``).
    """
    found: list[ClassNode] = []
    unresolved: list[str] = []
    for owner in graph.mro(outer):
        init = owner.methods.get("__init__")
        if init is None:
            continue
        for target, value in _assigned_targets(init):
            if not (_is_self_attr(target, attr) and isinstance(value, ast.Call)):
                continue
            classes = _constructed(graph, outer, owner, value)
            if not classes:
                unresolved.append(f"`self.{attr} = {ast.unparse(value.func)}(...)` in {owner.label}.__init__")
            for cls in classes:
                if cls not in found:
                    found.append(cls)
        if found or unresolved:
            break
    return found, unresolved


def _constructed(graph: ModelGraph, outer: ClassNode, owner: ClassNode, call: ast.Call) -> list[ClassNode]:
    name = _dotted(call.func)
    if name.startswith("self."):
        attr = name[len("self.") :]
        found = graph.find_method(outer, attr)
        if found is None:
            return _class_attribute(graph, outer, attr)
        # self._init_model(...): the factory method that runs for ``outer``.
        factory_owner, factory = found
        result = []
        for node in nodes_of(factory):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
                cls = graph.resolve(factory_owner.module, _dotted(node.value.func))
                if cls is not None:
                    result.append(cls)
        return result
    cls = graph.resolve(owner.module, name)
    if cls is not None:
        return [cls]
    return _parameter_default(graph, outer, owner, name)


def _class_attribute(graph: ModelGraph, outer: ClassNode, attr: str) -> list[ClassNode]:
    """``body_cls = qwen3_5.Qwen3_5ForCausalLM`` in the class body, most derived first."""
    for owner in graph.mro(outer):
        for stmt in owner.node.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets):
                cls = graph.resolve(owner.module, _dotted(stmt.value))
                return [cls] if cls is not None else []
    return []


def _parameter_default(graph: ModelGraph, outer: ClassNode, owner: ClassNode, name: str) -> list[ClassNode]:
    """``language_model_cls=Qwen3LLMModel`` in ``__init__``: the most derived default.

    Subclasses pass their own default on to ``super().__init__``, so the
    default of the most derived ``__init__`` with that parameter is the one
    that reaches ``owner``.
    """
    for cls in graph.mro(outer):
        init = cls.methods.get("__init__")
        default = _default_of(init, name) if init is not None else None
        if default is not None:
            found = graph.resolve(cls.module, _dotted(default))
            return [found] if found is not None else []
        if cls is owner:
            break
    return []


def _default_of(func: FunctionNode, name: str) -> ast.expr | None:
    args = func.args
    positional = args.posonlyargs + args.args
    for arg, default in zip(positional[len(positional) - len(args.defaults) :], args.defaults):
        if arg.arg == name:
            return default
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults):
        if arg.arg == name:
            return kw_default
    return None
