"""Edit 4 (model runner): CUDA graphs capture the configured aux layer ids.

In SGLang 0.4.10-0.5.10 the graph runner (``CudaGraphRunner.__init__``)
and, from 0.5.6, the warm-up (``ModelRunner._dummy_run``) call
``set_eagle3_layers_to_capture()`` with no ids right before they run the
model, while ``ModelRunner.initialize`` passes the draft's
``eagle_aux_hidden_state_layer_ids`` only after ``init_device_graphs()``.
The ``if i in self.layers_to_capture`` branch (and our embedding flag) is
Python, frozen into each graph when it is captured, so every replay
captures the default layers and never the embedding. A weight update with
``recapture_cuda_graph=True`` resets the ids the same way.

The fix has two edits, both found by structure, never by release:

- ``pass-ids``: every call with no ids passes the model runner's configured
  ids instead, ``getattr(runner, "eagle_aux_hidden_state_layer_ids", None)``.
  With no ids configured that is ``None``: the very default the bare call
  asked for, so nothing else changes.
- ``remember-ids``: where ``initialize`` keeps the ids in a local that is
  read only after graph capture (0.4.10-0.5.6), a marked copy of the
  release's own block that reads the draft config goes before the first
  statement that captures graphs, with its setter call replaced by
  ``self.eagle_aux_hidden_state_layer_ids = <ids>``. From 0.5.8 the runner
  already keeps them there, in ``__init__``.

A changed call carries the marker as a comment inside its parentheses, so
``revert`` (:func:`revert`) gives back exactly ``()``; the copied block is
an ordinary marked statement that the generic revert removes.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import libcst as cst

from patchcraft import MARKER
from patchcraft.errors import PatchcraftError
from patchcraft.graph import SETTER, EditSite
from patchcraft.sources import read_source
from patchcraft.transforms._base import AnchorError, Example, Outcome, edit_method, insert_at, is_marked, line_of

NAME = "configure_ids_before_graphs"
KIND = "runner"
#: The report row's model name.
ROW = "runner"
DESCRIPTION = (
    "In srt/model_executor/, make every set_eagle3_layers_to_capture() call made before "
    "CUDA-graph capture (graph runner, warm-up, recapture after a weight update) pass the "
    "model runner's configured aux layer ids, read from the draft config before any graph "
    "is captured, so replays capture the draft's layers (embedding included), not the defaults."
)
#: Where the model runner keeps the configured ids (SGLang's own name from 0.5.8).
ATTR = "eagle_aux_hidden_state_layer_ids"
PASS = "pass-ids"
REMEMBER = "remember-ids"
BEFORE_CAPTURE = "before-capture"
AFTER_CALL = "after-call"
PASS_COMMENT = f"{MARKER} graphs freeze the layers to capture: pass the configured ids, not the defaults"
REMEMBER_COMMENT = f"{MARKER} read the draft's EAGLE-3 aux layer ids before any graph is captured"


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


# -- planning (ast) ------------------------------------------------------------

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

    @property
    def has_ids(self) -> bool:
        return bool(self.node.args or self.node.keywords)

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.node.lineno} ({self.cls}.{self.method})" if self.cls else f"{self.path.name}:{self.node.lineno}"


def setter_calls(executor_dir: Path) -> list[SetterCall]:
    """Every setter call under ``executor_dir``, in file and line order."""
    found: list[SetterCall] = []
    for path in sorted(executor_dir.rglob("*.py")):
        try:
            if SETTER.encode() not in path.read_bytes():
                continue
        except OSError:
            continue
        text = read_source(path).text
        try:
            module = ast.parse(text)
        except SyntaxError as exc:
            raise PatchcraftError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}; nothing was changed") from None
        found.extend(_calls_in(path, text, module))
    return found


def _calls_in(path: Path, text: str, module: ast.Module) -> Iterator[SetterCall]:
    seen: set[int] = set()
    for classdef, func in _functions(module):
        for index, stmt in enumerate(func.body):
            for node in ast.walk(stmt):
                if _is_setter_call(node) and id(node) not in seen:
                    seen.add(id(node))
                    marked = MARKER in (ast.get_source_segment(text, node) or "")
                    cls = classdef.name if classdef else ""
                    yield SetterCall(path, cls, func.name, node, index, marked, classdef, func, module)
    for node in ast.walk(module):
        if _is_setter_call(node) and id(node) not in seen:
            yield SetterCall(path, "", "", node, 0, False, None, None, module)


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


def plan(executor_dir: Path) -> RunnerPlan:
    """Decide, from the structure of ``model_executor/``, what the runner needs."""
    calls = setter_calls(executor_dir)
    if not calls:
        return RunnerPlan(not_needed=f"not needed: no {SETTER} call in model_executor/")
    configured = [c for c in calls if c.has_ids and not c.marked]
    resets = [c for c in calls if not c.has_ids or c.marked]
    if not configured:
        return RunnerPlan(not_needed="not needed: the runner never passes configured ids (the setter takes none), so graph capture cannot lose them")
    if not resets:
        return RunnerPlan(not_needed="not needed: no call in model_executor/ resets the ids (every call passes the configured ids)")
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
        return f"cannot tell which call configures the ids: none of {where} passes a local or self.<attr> to self.<model>"
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
    params = (("edit", PASS), ("runner", ast.unparse(runner)), ("attr", attr), ("model", model_attr))
    return EditSite(kind=KIND, path=call.path, module=call.path.stem, cls=call.cls, method=call.method, params=params)


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
    name = source.node.args[0].id  # type: ignore[attr-defined]
    params = (
        ("edit", REMEMBER),
        ("name", name),
        ("attr", attr),
        ("model", _self_attr(source.node.func.value) or "model"),  # type: ignore[attr-defined]
        ("anchors", ",".join(sorted(anchors))),
        ("where", where),
    )
    return EditSite(kind=KIND, path=source.path, module=source.path.stem, cls=source.cls, method=source.method, params=params)


def _names_defined_late(source: SetterCall, first: int) -> list[str]:
    """Names the configuring block reads that nothing defines before ``first``."""
    assert source.func is not None
    block = source.func.body[source.index]
    available = set(dir(builtins)) | _module_names(source.module) | {a.arg for a in ast.walk(source.func.args) if isinstance(a, ast.arg)}
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


# -- applying (libcst) ---------------------------------------------------------

def is_marked_call(call: cst.Call) -> bool:
    """A call whose arguments patchcraft wrote: the marker sits inside its parentheses."""
    space = call.whitespace_before_args
    if not isinstance(space, cst.ParenthesizedWhitespace):
        return False
    comments = [line.comment for line in space.empty_lines] + [space.first_line.comment]
    return any(c is not None and c.value.startswith(MARKER) for c in comments)


def _is_setter(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == SETTER


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=()).code_for_node(node)


def canonical_call(module: cst.Module, site: EditSite) -> cst.Call:
    """The patched call: the runner's configured ids, behind the marker comment."""
    runner, attr = site.param("runner"), site.param("attr")
    code = f"_.{SETTER}(\n    {PASS_COMMENT}\n    getattr({runner}, \"{attr}\", None)\n)\n"
    stmt = cst.parse_statement(code, config=module.config_for_parsing)
    return stmt.body[0].value  # type: ignore[attr-defined, no-any-return]


class _PassIds(cst.CSTTransformer):
    def __init__(self, module: cst.Module, site: EditSite) -> None:
        super().__init__()
        self.site = site
        self.receiver = f"{site.param('runner')}.{site.param('model')}"
        self.canonical = canonical_call(module, site)
        self.statuses: list[str] = []
        self.odd: Optional[cst.Call] = None

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not _is_setter(updated) or _code(updated.func.value) != self.receiver:  # type: ignore[attr-defined]
            return updated
        if is_marked_call(updated):
            same = _code(updated.with_changes(func=self.canonical.func)) == _code(self.canonical)
            self.statuses.append("present" if same else "modified")
            return updated
        if updated.args:
            if ATTR in _code(updated) or (self.site.param("attr") or ATTR) in _code(updated):
                self.statuses.append("hand-applied")
            return updated
        space = updated.whitespace_before_args
        if not (isinstance(space, cst.SimpleWhitespace) and space.value == ""):
            self.odd = original
            return updated
        self.statuses.append("applied")
        return updated.with_changes(args=self.canonical.args, whitespace_before_args=self.canonical.whitespace_before_args)


def _pass_ids(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    editor = _PassIds(module, site)
    new = func.visit(editor)
    if editor.odd is not None:
        raise AnchorError(site, f"`{editor.receiver}.{SETTER}()` with nothing between its parentheses (found `{_code(editor.odd)}`)")
    statuses = editor.statuses
    if "modified" in statuses:
        return func, Outcome("modified", f"the ids passed to {SETTER} were changed by hand")
    for status in ("applied", "present", "hand-applied"):
        if status in statuses:
            return new, Outcome(status)  # type: ignore[return-value]
    raise AnchorError(site, f"a `{editor.receiver}.{SETTER}()` call")


class _CaptureFinder(cst.CSTVisitor):
    """Does a statement capture graphs, reset the ids, or call a method that does?"""

    def __init__(self, anchors: set[str]) -> None:
        super().__init__()
        self.anchors = anchors
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            if isinstance(func.value, cst.Name) and func.value.value == "self" and func.attr.value in self.anchors:
                self.found = True
            if func.attr.value == SETTER and (not node.args or is_marked_call(node)):
                self.found = True

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value.endswith("GraphRunner"):
            self.found = True

    def visit_Name(self, node: cst.Name) -> None:
        if node.value.endswith("GraphRunner"):
            self.found = True


def _captures(stmt: cst.CSTNode, anchors: set[str]) -> bool:
    finder = _CaptureFinder(anchors)
    stmt.visit(finder)
    return finder.found


class _SwapSetterCall(cst.CSTTransformer):
    """In the copy, ``self.model.set_...(ids)`` becomes ``self.<attr> = ids``."""

    def __init__(self, module: cst.Module, name: str, attr: str) -> None:
        super().__init__()
        self.module, self.name, self.attr, self.count = module, name, attr, 0

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine) -> cst.BaseStatement:
        if not _is_configuring_line(updated, self.name):
            return updated
        self.count += 1
        new = cst.parse_statement(f"self.{self.attr} = {self.name}\n", config=self.module.config_for_parsing)
        return new.with_changes(leading_lines=updated.leading_lines)


def _is_configuring_line(stmt: cst.CSTNode, name: str) -> bool:
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return False
    call = stmt.body[0].value
    return (
        isinstance(call, cst.Call)
        and _is_setter(call)
        and len(call.args) == 1
        and isinstance(call.args[0].value, cst.Name)
        and call.args[0].value.value == name
    )


class _LineFinder(cst.CSTVisitor):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.found: list[cst.SimpleStatementLine] = []

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if _is_configuring_line(node, self.name):
            self.found.append(node)


def _configuring_lines(node: cst.CSTNode, name: str) -> list[cst.SimpleStatementLine]:
    finder = _LineFinder(name)
    node.visit(finder)
    return finder.found


def _marked_remembers(func: cst.FunctionDef, attr: str) -> list[cst.BaseStatement]:
    found: list[cst.BaseStatement] = []

    class Finder(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            if is_marked(node):
                found.append(node)

        def visit_If(self, node: cst.If) -> None:
            if is_marked(node):
                found.append(node)

    func.visit(Finder())
    return [s for s in found if f"self.{attr} =" in _code(s)]


def remember_block(module: cst.Module, block: cst.BaseStatement, site: EditSite) -> cst.BaseStatement:
    """The marked copy of the configuring ``block``, keeping the ids on the runner."""
    swap = _SwapSetterCall(module, site.param("name") or "", site.param("attr") or ATTR)
    copy = block.visit(swap)
    assert swap.count == 1
    comment = cst.EmptyLine(comment=cst.Comment(REMEMBER_COMMENT))
    return copy.with_changes(leading_lines=(comment,))  # type: ignore[return-value]


def remember_line(module: cst.Module, site: EditSite) -> cst.BaseStatement:
    code = f"{REMEMBER_COMMENT}\nself.{site.param('attr')} = {site.param('name')}\n"
    return cst.parse_statement(code, config=module.config_for_parsing)


def _remember_ids(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    name, attr = site.param("name") or "", site.param("attr") or ATTR
    body = list(func.body.body) if isinstance(func.body, cst.IndentedBlock) else []
    holders = [s for s in body if not is_marked(s) and _configuring_lines(s, name)]
    if len(holders) != 1:
        raise AnchorError(site, f"one `self.<model>.{SETTER}({name})` call in {site.method}, found {len(holders)}")
    block = holders[0]
    before = site.param("where") == BEFORE_CAPTURE
    canonical = remember_block(module, block, site) if before else remember_line(module, site)
    existing = _marked_remembers(func, attr)
    if existing:
        same = _code(existing[0].with_changes(leading_lines=())) == _code(canonical.with_changes(leading_lines=()))  # type: ignore[call-arg]
        if same:
            return func, Outcome("present")
        return func, Outcome("modified", f"line {line_of(module, existing[0])}: the block that keeps the ids was changed by hand")
    if not before:
        return insert_at(func, _configuring_lines(block, name)[0], canonical, after=True), Outcome("applied")
    anchors = set(filter(None, (site.param("anchors") or "").split(",")))
    capture = next((s for s in body if _captures(s, anchors)), None)
    if capture is None or body.index(capture) > body.index(block):
        raise AnchorError(site, "the statement that captures graphs, before the one that configures the ids")
    return insert_at(func, capture, canonical, after=False), Outcome("applied")


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    """Apply one runner site (``pass-ids`` or ``remember-ids``) to ``module``."""
    edit = _pass_ids if site.param("edit") == PASS else _remember_ids
    return edit_method(module, site, edit)


class _RevertCalls(cst.CSTTransformer):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if _is_setter(updated) and is_marked_call(updated):
            return updated.with_changes(args=(), whitespace_before_args=cst.SimpleWhitespace(""))
        return updated


def revert(module: cst.Module) -> cst.Module:
    """Give every call this transform changed its ``()`` back (marked statements go elsewhere)."""
    return module.visit(_RevertCalls())


# -- examples (unit tests and docs) ------------------------------------------------

_GRAPH_SITE = EditSite(
    kind=KIND,
    path=Path("cuda_graph_runner.py"),
    module="cuda_graph_runner",
    cls="CudaGraphRunner",
    method="__init__",
    params=(("edit", PASS), ("runner", "self.model_runner"), ("attr", ATTR), ("model", "model")),
)
_RUNNER_SITE = EditSite(
    kind=KIND,
    path=Path("model_runner.py"),
    module="model_runner",
    cls="ModelRunner",
    method="initialize",
    params=(
        ("edit", REMEMBER),
        ("name", "eagle_aux_hidden_state_layer_ids"),
        ("attr", ATTR),
        ("model", "model"),
        ("anchors", "init_cuda_graphs"),
        ("where", BEFORE_CAPTURE),
    ),
)

EXAMPLES = [
    Example(
        title="the graph runner passes the configured ids, not none",
        site=_GRAPH_SITE,
        before='''\
class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        # Speculative_inference
        if model_runner.spec_algorithm.is_eagle3():
            self.model_runner.model.set_eagle3_layers_to_capture()

        self.capture()
''',
        after='''\
class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        # Speculative_inference
        if model_runner.spec_algorithm.is_eagle3():
            self.model_runner.model.set_eagle3_layers_to_capture(
                # patchcraft: graphs freeze the layers to capture: pass the configured ids, not the defaults
                getattr(self.model_runner, "eagle_aux_hidden_state_layer_ids", None)
            )

        self.capture()
''',
    ),
    Example(
        title="the draft's ids are read before the graphs are captured",
        site=_RUNNER_SITE,
        before='''\
class ModelRunner:
    def initialize(self, min_per_gpu_memory):
        server_args = self.server_args
        if self.device == "cuda":
            self.init_attention_backend()
            self.init_cuda_graphs()

        # auxiliary hidden capture mode
        if self.spec_algorithm.is_eagle3() and not self.is_draft_worker:
            draft_model_config = ModelConfig.from_server_args(server_args, is_draft_model=True)
            try:
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                eagle_aux_hidden_state_layer_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                eagle_aux_hidden_state_layer_ids = None

            self.model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)
''',
        after='''\
class ModelRunner:
    def initialize(self, min_per_gpu_memory):
        server_args = self.server_args
        # patchcraft: read the draft's EAGLE-3 aux layer ids before any graph is captured
        if self.spec_algorithm.is_eagle3() and not self.is_draft_worker:
            draft_model_config = ModelConfig.from_server_args(server_args, is_draft_model=True)
            try:
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                eagle_aux_hidden_state_layer_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                eagle_aux_hidden_state_layer_ids = None

            self.eagle_aux_hidden_state_layer_ids = eagle_aux_hidden_state_layer_ids
        if self.device == "cuda":
            self.init_attention_backend()
            self.init_cuda_graphs()

        # auxiliary hidden capture mode
        if self.spec_algorithm.is_eagle3() and not self.is_draft_worker:
            draft_model_config = ModelConfig.from_server_args(server_args, is_draft_model=True)
            try:
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                eagle_aux_hidden_state_layer_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                eagle_aux_hidden_state_layer_ids = None

            self.model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)
''',
    ),
    Example.unchanged(
        title="a call already passing the runner's ids by hand is recognised, not doubled",
        site=_GRAPH_SITE,
        text='''\
class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.model_runner.model.set_eagle3_layers_to_capture(
            self.model_runner.eagle_aux_hidden_state_layer_ids
        )
''',
    ),
]
