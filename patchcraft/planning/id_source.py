"""Where a tree's model runner takes the aux layer ids from: read at the runner's own call site.

SGLang releases pass the draft config's ``eagle_config.eagle_aux_hidden_state_layer_ids``
to ``set_eagle3_layers_to_capture`` (``ModelRunner``, 0.5.10 ``model_runner.py:374``
and ``:668``); a fork may read them from a server flag (``server_args.X``),
from the draft config's top level, or pass none at all (the defaults). So the
place is read, never assumed: the explicit setter call in ``srt/model_executor/``
(:func:`patchcraft.planning.runner_edits.setter_calls`), its argument followed
to the assignments of that name or attribute in the same directory (and, for a
parameter, to the keyword its callers pass), and each assigned expression
classified by what it reads.
"""

from __future__ import annotations

import ast
import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from patchcraft.reading.parsed import parse_python, statements
from patchcraft.base.sources import decode
from patchcraft.base.target import SglangTree
from patchcraft.planning.runner_edits import SetterCall, setter_calls
from patchcraft.reading.server_args import flag_for

#: The draft config's key every SGLang release reads.
KEY = "eagle_aux_hidden_state_layer_ids"
NESTED = f"eagle_config.{KEY}"


class IdSourceKind(str, enum.Enum):
    """Where the runner's ids come from (the JSON's ``id_source.kind``)."""

    #: The draft config's ``eagle_config.eagle_aux_hidden_state_layer_ids`` (every SGLang release).
    EAGLE_CONFIG = "eagle-config"
    #: The draft config's top-level ``eagle_aux_hidden_state_layer_ids``.
    TOP_LEVEL = "top-level"
    #: A server flag (``server_args.X``).
    SERVER_FLAG = "server-flag"
    #: The runner calls the setter with no ids: the defaults, whatever the config says.
    NONE = "none"
    #: A call with ids whose source patchcraft cannot read.
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class IdSource:
    """Where this tree's runner reads the ids it passes to the setter."""

    kind: IdSourceKind
    #: ``eagle_config.eagle_aux_hidden_state_layer_ids``, ``eagle_aux_hidden_state_layer_ids`` or ``--flag`` ("": none).
    field: str = ""
    #: Where the value is read (``sglang/srt/model_executor/model_runner.py:374``), and the call that passes it.
    read_at: str = ""
    call: str = ""

    @property
    def from_draft(self) -> bool:
        return self.kind in (IdSourceKind.EAGLE_CONFIG, IdSourceKind.TOP_LEVEL)

    @property
    def passes_ids(self) -> bool:
        """The runner's call passes an argument (a setter taking none raises at start-up)."""
        return self.kind is not IdSourceKind.NONE

    def setting(self, ids: tuple[int, ...] | list[int]) -> str:
        """The edit that gives the runner ``ids``: ``set eagle_config.eagle_aux_hidden_state_layer_ids = [...]``,
        ``serve with --flag 1,2,3``, or "" where the runner takes none."""
        if self.kind is IdSourceKind.SERVER_FLAG:
            return f"serve with {self.field} {','.join(map(str, ids))}"
        if self.kind is IdSourceKind.TOP_LEVEL:
            return f"set the draft config's top-level {self.field} = {list(ids)}"
        if self.kind is IdSourceKind.EAGLE_CONFIG:
            return f"set {self.field} = {list(ids)}"
        return ""

    @property
    def text(self) -> str:
        """``the draft config's eagle_config.eagle_aux_hidden_state_layer_ids (read at ...)``, in words."""
        at = f" (read at {self.read_at})" if self.read_at else ""
        if self.kind is IdSourceKind.EAGLE_CONFIG:
            return f"the draft config's {self.field}{at}"
        if self.kind is IdSourceKind.TOP_LEVEL:
            return f"the draft config's top-level {self.field}{at}"
        if self.kind is IdSourceKind.SERVER_FLAG:
            return f"the server flag {self.field}{at}, not the draft config"
        if self.kind is IdSourceKind.NONE:
            return f"no ids: the runner calls the setter without them ({self.call}), so the defaults, whatever the config says"
        return f"a value patchcraft cannot trace ({self.call})"


#: What SGLang releases do, when nothing under ``srt/model_executor/`` says otherwise.
RELEASE_DEFAULT = IdSource(IdSourceKind.EAGLE_CONFIG, NESTED)


def id_source(tree: SglangTree) -> IdSource:
    """Where ``tree``'s runner takes the ids from (:data:`RELEASE_DEFAULT` when it has no readable runner)."""
    directory = tree.executor_dir
    if not directory.is_dir():
        return RELEASE_DEFAULT
    calls = setter_calls(directory, strict=False)
    if not calls:
        return RELEASE_DEFAULT
    explicit = [c for c in calls if c.has_ids and not _passes_none(c)]
    if not explicit:
        return IdSource(IdSourceKind.NONE, call=", ".join(c.where for c in calls))
    own = [c for c in explicit if not c.marked]  # patchcraft's runner edit passes the release's own ids on
    call = (own or explicit)[-1]  # the configuring call comes after the resets
    modules = list(_modules(directory))
    found = [_classify(tree, path, node, modules) for path, node in _assigned(call, modules)]
    ranked = sorted((s for s in found if s is not None), key=lambda s: _RANK[s.kind])
    if not ranked:
        return IdSource(IdSourceKind.UNKNOWN, call=call.where)
    best = ranked[0]
    return IdSource(best.kind, best.field, best.read_at, call.where)


_RANK = {IdSourceKind.SERVER_FLAG: 0, IdSourceKind.EAGLE_CONFIG: 1, IdSourceKind.TOP_LEVEL: 2}


def _passes_none(call: SetterCall) -> bool:
    values = list(call.node.args) + [k.value for k in call.node.keywords]
    return all(isinstance(v, ast.Constant) and v.value is None for v in values)


class _Module:
    """A runner module's text, parsed when a reading first needs its tree (most are ruled out by their text)."""

    __slots__ = ("path", "text", "_tree")

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.text = path, text
        self._tree: ast.Module | None = None

    @property
    def tree(self) -> ast.Module:
        if self._tree is None:
            try:
                self._tree = parse_python(self.text)
            except (SyntaxError, ValueError):  # unreadable: read as empty, as if it were not there
                self._tree = ast.Module(body=[], type_ignores=[])
        return self._tree


def _modules(directory: Path) -> Iterator[_Module]:
    for path in sorted(directory.rglob("*.py")):
        try:
            data = path.read_bytes()
            if KEY.encode() not in data and b"server_args" not in data:
                continue
            yield _Module(path, decode(path, data).text)
        except (OSError, ValueError):
            continue


def _argument(call: SetterCall) -> ast.expr:
    return call.node.args[0] if call.node.args else call.node.keywords[0].value


def _assigned(call: SetterCall, modules: list[_Module]) -> Iterator[tuple[Path, ast.expr]]:
    """The expressions assigned to what the call passes: an attribute by its name, a parameter through its callers."""
    argument = _argument(call)
    name = argument.attr if isinstance(argument, ast.Attribute) else _getattr_name(argument)
    if isinstance(argument, ast.Name):
        found = list(_local_values(call, argument.id))
        if found:
            yield from ((call.path, value) for value in found)
            return
        # the first attribute a call passes for the parameter names what the ids are (modules read lazily: it stops there)
        values = _keyword_values(modules, argument.id)
        attribute = next((v.attr for v in values if isinstance(v, ast.Attribute)), None)
        yield from _attribute_values(modules, attribute) if attribute is not None else ()
        return
    if name is not None:
        yield from _attribute_values(modules, name)
        return
    yield call.path, argument


def _getattr_name(node: ast.expr) -> str | None:
    """``getattr(obj, "name", ...)``: ``name``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[1].value
    return None


def _local_values(call: SetterCall, name: str) -> Iterator[ast.expr]:
    if call.func is None:
        return
    for node in ast.walk(call.func):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            yield node.value


def _keyword_values(modules: list[_Module], keyword: str) -> Iterator[ast.expr]:
    for module in modules:
        if not _may_pass(module, keyword):
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Call):
                yield from (k.value for k in node.keywords if k.arg == keyword)


def _may_name(module: _Module, name: str) -> bool:
    """Whether ``module`` may hold the identifier ``name``: its text spells it, or is not ASCII (where an
    identifier may be spelt otherwise and normalised, NFKC). A module that cannot is not walked."""
    return name in module.text or not module.text.isascii()


def _may_pass(module: _Module, keyword: str) -> bool:
    """Whether a call in ``module`` may pass the keyword argument ``keyword``: its text spells ``keyword =``
    (comments and line breaks allowed between), or is not ASCII (:func:`_may_name`)."""
    if not module.text.isascii():
        return True
    return re.search(rf"(?<!\.)\b{re.escape(keyword)}(?:\s|\\\n|#[^\n]*)*=(?!=)", module.text) is not None


def _attribute_values(modules: list[_Module], attr: str) -> Iterator[tuple[Path, ast.expr]]:
    for module in modules:
        if not _may_name(module, attr):
            continue
        for node in statements(module.tree.body):  # an assignment is a statement: ast.walk's order, no expressions
            if not isinstance(node, ast.Assign) or _is_none(node.value):
                continue
            if any(isinstance(t, ast.Attribute) and t.attr == attr for t in node.targets):
                yield module.path, node.value


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _classify(tree: SglangTree, path: Path, value: ast.expr, modules: list[_Module]) -> IdSource | None:
    """What ``value`` reads: the server flag, the draft config's key (nested or top level), or None."""
    at = f"{tree.relative(path)}:{value.lineno}"
    for node in ast.walk(value):
        dest = _server_args_attr(node)
        if dest is not None:
            return IdSource(IdSourceKind.SERVER_FLAG, flag_for(tree.package, dest), at)
    text = ast.unparse(value)
    if KEY in text:
        nested = "eagle_config" in text or _bound_to_eagle_config(path, value, modules)
        return IdSource(IdSourceKind.EAGLE_CONFIG if nested else IdSourceKind.TOP_LEVEL, NESTED if nested else KEY, at)
    return None


def _server_args_attr(node: ast.AST) -> str | None:
    """``server_args.X`` or ``self.server_args.X``: ``X``."""
    if not isinstance(node, ast.Attribute):
        return None
    base = node.value
    if isinstance(base, ast.Name) and base.id == "server_args":
        return node.attr
    if isinstance(base, ast.Attribute) and base.attr == "server_args":
        return node.attr
    return None


def _bound_to_eagle_config(path: Path, value: ast.expr, modules: list[_Module]) -> bool:
    """``x[KEY]`` where ``x = getattr(..., "eagle_config", ...)`` in the same file."""
    names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
    for module in modules:
        if module.path != path:
            continue
        for node in statements(module.tree.body):
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id in names for t in node.targets)
                and "eagle_config" in ast.unparse(node.value)
            ):
                return True
    return False
