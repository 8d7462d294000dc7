"""Plan the model runner's edits: what ``srt/model_executor/`` needs so that CUDA graphs
capture the configured aux layer ids (the ``runner`` row; the edits themselves are
``transforms/configure_ids_before_graphs.py``).

Everything here is read with ``ast`` from the structure of the runner,
never from a release number: the setter calls (:func:`setter_calls`, also
what ``explain`` reports as resets), the one call that configures the
draft's ids, and for each call that resets them an edit site with typed
parameters (:class:`PassIds`, :class:`RememberIds`).
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

from patchcraft.reading.parsed import parse_python
from patchcraft import MARKER
from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.class_graph import SETTER, SiteParams
from patchcraft.planning.records import EditSite
from patchcraft.base.sources import decode
from patchcraft.base.status import EditKind

#: The edit kind of the runner sites.
KIND = EditKind.RUNNER
#: The report row's model name.
ROW = "runner"
#: Where the model runner keeps the configured ids (SGLang's own name from 0.5.8).
ATTR = "eagle_aux_hidden_state_layer_ids"
#: Where ``remember-ids`` puts the ids: before the first statement that captures graphs, or after the call.
BEFORE_CAPTURE = "before-capture"
AFTER_CALL = "after-call"


@dataclass(frozen=True)
class PassIds(SiteParams):
    """``pass-ids``: a call with no ids passes ``getattr(<runner>, "<attr>", None)`` instead."""

    runner: str
    attr: str
    model: str


@dataclass(frozen=True)
class RememberIds(SiteParams):
    """``remember-ids``: ``self.<attr> = <name>``, before graph capture or right after the configuring call."""

    name: str
    attr: str
    model: str
    #: Methods of the runner class that capture graphs or reset the ids.
    anchors: frozenset[str]
    #: :data:`BEFORE_CAPTURE` or :data:`AFTER_CALL`.
    where: str


RunnerEdit = Union[PassIds, RememberIds]


def runner_site(path: Path, cls: str, method: str, edit: RunnerEdit) -> EditSite:
    """The edit site of ``edit`` in ``cls.method`` of ``path``."""
    return EditSite(kind=KIND, path=path, module=path.stem, cls=cls, method=method, params=edit)


@dataclass(frozen=True)
class RunnerPlan:
    """What the runner needs: edit sites, or why it needs none (or cannot be helped)."""

    sites: tuple[EditSite, ...] = ()
    not_needed: Optional[str] = None
    unsupported: Optional[str] = None
    runner: Optional[Path] = None

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(s.path for s in self.sites))


@dataclass(frozen=True)
class SetterCall:
    """One ``set_eagle3_layers_to_capture`` call found in ``model_executor/``."""

    path: Path
    cls: str
    method: str
    node: ast.Call
    index: int  # top-level statement of ``method`` holding the call
    marked: bool
    classdef: Optional[ast.ClassDef]
    func: Optional[ast.FunctionDef]
    module: ast.Module
    #: The innermost function around the call (None: none, module level).
    function: Optional[str] = None

    @property
    def has_ids(self) -> bool:
        return bool(self.node.args or self.node.keywords)

    @property
    def where(self) -> str:
        return (
            f"{self.path.name}:{self.node.lineno} ({self.cls}.{self.method})"
            if self.cls
            else f"{self.path.name}:{self.node.lineno}"
        )


def setter_calls(executor_dir: Path, strict: bool = True) -> list[SetterCall]:
    """Every setter call under ``executor_dir``, in file and line order.

    A file that does not parse is an error (``strict``: nothing can be
    planned around it) or is passed over (``explain`` only reports what it
    can read).
    """
    found: list[SetterCall] = []
    for path in sorted(executor_dir.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if SETTER.encode() not in data:
            continue
        text = decode(path, data).text
        try:
            module = parse_python(text)
        except SyntaxError as exc:
            if not strict:
                continue
            raise PatchcraftError(
                f"{path}: syntax error at line {exc.lineno}: {exc.msg}; nothing was changed"
            ) from None
        found.extend(_calls_in(path, text, module))
    return found


def _calls_in(path: Path, text: str, module: ast.Module) -> Iterator[SetterCall]:
    """The setter calls of ``module``: those in a top-level function or method by function and statement, then the
    rest. The module is walked once; only the statements that hold a call are walked again (the runner file has
    thousands of lines and a handful of calls)."""
    calls: list[ast.Call] = []
    functions: list[ast.AST] = []
    for node in ast.walk(module):  # breadth first: an inner function comes after the one around it
        if isinstance(node, ast.Call) and _is_setter_call(node):
            calls.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(node)
    if not calls:
        return
    innermost = {id(call): name for call in calls if (name := _innermost(call, functions))}
    lines = _lines(text)  # split once: ast.get_source_segment splits the whole text per call
    seen: set[int] = set()
    for classdef, func in _functions(module):
        for index, stmt in enumerate(func.body):
            if not any(_within(call, stmt) for call in calls):
                continue
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and _is_setter_call(node) and id(node) not in seen:
                    seen.add(id(node))
                    marked = MARKER in _segment(lines, node)
                    cls = classdef.name if classdef else ""
                    yield SetterCall(
                        path, cls, func.name, node, index, marked, classdef, func, module, innermost.get(id(node))
                    )
    for node in calls:
        if id(node) not in seen:
            yield SetterCall(path, "", "", node, 0, False, None, None, module, innermost.get(id(node)))


#: Where ``ast`` ends a line (not at a form feed, as str.splitlines() does).
_LINE_END = re.compile(r"\r\n|\r|\n")


def _lines(text: str) -> list[str]:
    """The text's lines with their endings, split where ``ast`` counts lines (not at a form feed)."""
    lines, start = [], 0
    for match in _LINE_END.finditer(text):
        lines.append(text[start : match.end()])
        start = match.end()
    return [*lines, text[start:]] if start < len(text) else lines


def _segment(lines: Sequence[str], node: ast.AST) -> str:
    """``ast.get_source_segment(text, node)`` from the text's lines, split once (offsets are UTF-8 bytes)."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1  # type: ignore[attr-defined]
    start, end = node.col_offset, node.end_col_offset or 0  # type: ignore[attr-defined]
    if first == last:
        return lines[first].encode()[start:end].decode()
    head, tail = lines[first].encode()[start:].decode(), lines[last].encode()[:end].decode()
    return "".join([head, *lines[first + 1 : last], tail])


def _within(node: ast.AST, outer: ast.AST) -> bool:
    """Whether ``node``'s source span lies inside ``outer``'s, decorators included (``ast.walk`` visits them)."""
    start = (node.lineno, node.col_offset)  # type: ignore[attr-defined]
    end = (node.end_lineno or node.lineno, node.end_col_offset or 0)  # type: ignore[attr-defined]
    first = min([(outer.lineno, outer.col_offset)] + [(d.lineno, 0) for d in getattr(outer, "decorator_list", ())])  # type: ignore[attr-defined]
    return first <= start and end <= (
        outer.end_lineno or outer.lineno,  # type: ignore[attr-defined]
        outer.end_col_offset or 0,  # type: ignore[attr-defined]
    )


def _innermost(call: ast.Call, functions: Sequence[ast.AST]) -> Optional[str]:
    """The name of the innermost function around ``call`` (``functions`` breadth first: the last that holds it)."""
    name = None
    for func in functions:
        if _within(call, func):
            name = func.name  # type: ignore[attr-defined]
    return name


def _functions(module: ast.Module) -> Iterator[tuple[Optional[ast.ClassDef], ast.FunctionDef]]:
    for stmt in module.body:
        if isinstance(stmt, ast.ClassDef):
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef):
                    yield stmt, item
        elif isinstance(stmt, ast.FunctionDef):
            yield None, stmt


def _is_setter_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == SETTER


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _self_attr(node: ast.AST) -> Optional[str]:
    return node.attr if isinstance(node, ast.Attribute) and _is_self(node.value) else None


def plan_runner(executor_dir: Path) -> RunnerPlan:
    """Decide, from the structure of ``model_executor/``, what the runner needs."""
    calls = setter_calls(executor_dir)
    if not calls:
        return RunnerPlan(not_needed=f"not needed: no {SETTER} call in model_executor/")
    configured = [c for c in calls if c.has_ids and not c.marked]
    resets = [c for c in calls if not c.has_ids or c.marked]
    if not configured:
        return RunnerPlan(
            not_needed="not needed: the runner never passes configured ids (the setter takes none), so graph capture cannot lose them"
        )
    if not resets:
        return RunnerPlan(
            not_needed="not needed: no call in model_executor/ resets the ids (every call passes the configured ids)"
        )
    source = _configuring_call(configured)
    if isinstance(source, str):
        return RunnerPlan(unsupported=source)
    assert source.classdef is not None and source.func is not None
    model_attr = _self_attr(source.node.func.value)  # type: ignore[attr-defined]
    arg = source.node.args[0]
    sites: list[EditSite] = []
    attr = _self_attr(arg)
    if attr is None:
        attr = ATTR
        remember = _remember_site(source, resets, attr)
        if isinstance(remember, str):
            return RunnerPlan(unsupported=remember)
        sites.append(remember)
    elif not _class_assigns(source.classdef, attr):
        return RunnerPlan(unsupported=f"{source.where}: passes self.{attr}, which {source.cls} never assigns")
    for call in resets:
        site = _pass_site(call, source, model_attr or "model", attr)
        if isinstance(site, str):
            return RunnerPlan(unsupported=site)
        if site not in sites:
            sites.append(site)
    return RunnerPlan(sites=tuple(sites), runner=source.path)


def _configuring_call(configured: Sequence[SetterCall]) -> SetterCall | str:
    """The one call that passes the draft's ids to the runner's own model."""
    candidates = [
        c
        for c in configured
        if c.classdef is not None
        and c.func is not None
        and _self_attr(c.node.func.value) is not None  # type: ignore[attr-defined]
        and len(c.node.args) == 1
        and not c.node.keywords
        and (isinstance(c.node.args[0], ast.Name) or _self_attr(c.node.args[0]) is not None)
    ]
    by_local = [c for c in candidates if isinstance(c.node.args[0], ast.Name)]
    if len(by_local) == 1:
        return by_local[0]
    attrs = {_self_attr(c.node.args[0]) for c in candidates}
    if not by_local and len(attrs) == 1:
        return candidates[0]
    where = ", ".join(c.where for c in configured)
    if not candidates:
        return (
            f"cannot tell which call configures the ids: none of {where} passes a local or self.<attr> to self.<model>"
        )
    return f"cannot tell which call configures the ids: several do ({where})"


def _class_assigns(classdef: ast.ClassDef, attr: str) -> bool:
    for node in ast.walk(classdef):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        if any(_self_attr(t) == attr for t in targets):
            return True
    return False


def _pass_site(call: SetterCall, source: SetterCall, model_attr: str, attr: str) -> EditSite | str:
    receiver = call.node.func.value  # type: ignore[attr-defined]
    if not call.cls or not call.method:
        return f"{call.where}: a {SETTER}() call outside a class method; cannot pass it the ids"
    if not (isinstance(receiver, ast.Attribute) and receiver.attr == model_attr):
        return f"{call.where}: {SETTER}() is not called on <runner>.{model_attr}; cannot tell whose ids to pass"
    runner = receiver.value
    if call.cls == source.cls and not _is_self(runner):
        return f"{call.where}: {SETTER}() on {ast.unparse(receiver)}, not on self.{model_attr}"
    return runner_site(
        call.path, call.cls, call.method, PassIds(runner=ast.unparse(runner), attr=attr, model=model_attr)
    )


def capture_methods(classdef: ast.ClassDef) -> set[str]:
    """Methods of the runner class that capture graphs or reset the ids, directly or not."""
    methods = {f.name: f for f in classdef.body if isinstance(f, ast.FunctionDef)}
    reached = {name for name, func in methods.items() if _captures_directly(func)}
    grown = True
    while grown:
        grown = False
        for name, func in methods.items():
            if name not in reached and _self_calls(func) & reached:
                reached.add(name)
                grown = True
    return reached


def _captures_directly(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id.endswith("GraphRunner"):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr.endswith("GraphRunner"):
            return True
        if _is_setter_call(sub) and not (sub.args or sub.keywords):  # type: ignore[attr-defined]
            return True
    return False


def _self_calls(node: ast.AST) -> set[str]:
    return {
        sub.func.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and _is_self(sub.func.value)
    }


def _first_capture(func: ast.FunctionDef, anchors: set[str], resets: Sequence[SetterCall]) -> Optional[int]:
    reset_nodes = {id(c.node) for c in resets}
    for index, stmt in enumerate(func.body):
        if _captures_directly(stmt) or _self_calls(stmt) & anchors:
            return index
        if any(id(n) in reset_nodes for n in ast.walk(stmt)):
            return index
    return None


def _remember_site(source: SetterCall, resets: Sequence[SetterCall], attr: str) -> EditSite | str:
    """Where and how the runner keeps the ids that ``source`` passes in a local."""
    assert source.classdef is not None and source.func is not None
    anchors = capture_methods(source.classdef) - {source.method}
    first = _first_capture(source.func, anchors, resets)
    if first is None and not anchors:
        return f"{source.where}: cannot find where {source.cls} captures graphs"
    where = AFTER_CALL if first is None or first > source.index else BEFORE_CAPTURE
    if where == BEFORE_CAPTURE:
        assert first is not None
        missing = _names_defined_late(source, first)
        if missing:
            return f"{source.where}: the block that reads the ids uses `{missing[0]}`, which is only defined after graph capture"
    edit = RememberIds(
        name=source.node.args[0].id,  # type: ignore[attr-defined]
        attr=attr,
        model=_self_attr(source.node.func.value) or "model",  # type: ignore[attr-defined]
        anchors=frozenset(anchors),
        where=where,
    )
    return runner_site(source.path, source.cls, source.method, edit)


def _names_defined_late(source: SetterCall, first: int) -> list[str]:
    """Names the configuring block reads that nothing defines before ``first``."""
    assert source.func is not None
    block = source.func.body[source.index]
    available = (
        set(dir(builtins))
        | _module_names(source.module)
        | {a.arg for a in ast.walk(source.func.args) if isinstance(a, ast.arg)}
    )
    for stmt in source.func.body[:first]:
        available |= _stored(stmt)
    available |= _stored(block)
    loads = sorted({n.id for n in ast.walk(block) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)})
    return [name for name in loads if name not in available]


def _stored(node: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    names |= {h.name for h in ast.walk(node) if isinstance(h, ast.ExceptHandler) and h.name}
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    return names


def _module_names(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        else:
            names |= _stored(stmt)
    return names
