"""The runner transform (``configure_ids_before_graphs``) on real releases.

In 0.4.10-0.5.10 CUDA-graph capture (and the warm-up, and a recapture
after a weight update) resets the EAGLE-3 aux layer ids to the defaults,
so the graphs capture the wrong layers whatever the draft config says.
Here, on the real ``srt/model_executor/`` of each release:

- golden diffs, idempotence and a byte-identical revert (0.4.10 0.5.2
  0.5.6 0.5.10), and "not needed" where the defect is absent;
- a static proof on the whole coverage matrix: start-up is linearised
  (``ModelRunner.__init__``, its ``self.`` calls, module functions and the
  graph runners it builds, in source order) and no setter call before a
  graph capture may lack the configured ids;
- the patched code itself, sliced out of the release and run on stand-ins
  for CUDA, to watch which ids the model's setter receives at capture.

Every check is also run on the unpatched release and must fail there.
"""

from __future__ import annotations

import ast
import builtins
import collections
import copy
import json
import os
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from patchcraft.engine.diffs import unified_diff
from patchcraft.engine.tree_run import run, write_changes
from patchcraft.engine.file_patch import revert_text
from patchcraft.engine.records import Mode
from patchcraft.base.status import ModelStatus
from patchcraft.transforms import configure_ids_before_graphs as transform
from patchcraft.base.target import resolve_target

from conftest import GOLDEN, release_package

FIXED = ("0.4.10", "0.5.2", "0.5.6", "0.5.10")
from patchcraft.base.releases import MATRIX  # noqa: E402  (the one list: patchcraft/base/releases.py)

UNAFFECTED = tuple(v for v in MATRIX if v not in FIXED)
RUNNER_FILES = ("model_runner", "cuda_graph_runner")
SETTER = "set_eagle3_layers_to_capture"
KEY = "eagle_aux_hidden_state_layer_ids"
IDS = [-1, 2, 30]


# -- trees ------------------------------------------------------------------------


def runner_tree(version: str, dest: Path) -> Path:
    """A light copy of a release: ``srt/model_executor`` and the version files (no models)."""
    source = release_package(version)
    package = dest / "sglang"
    shutil.copytree(
        source / "srt" / "model_executor",
        package / "srt" / "model_executor",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (package / "srt" / "models").mkdir(parents=True)
    for name in ("version.py", "_version.py", "__init__.py"):
        if (source / name).is_file():
            shutil.copy2(source / name, package / name)
    return package


def executor_texts(package: Path) -> dict[str, bytes]:
    directory = package / "srt" / "model_executor"
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*.py"))}


@dataclass
class Patched:
    """One release, runner-only: pristine bytes, the first apply, then everything after it."""

    package: Path
    pristine: dict
    first: Any
    second: Any = None
    verify: Any = None
    diffs: dict = field(default_factory=dict)
    reverted: dict = field(default_factory=dict)


_STATE: dict[str, Patched] = {}


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Patched]:
    def make(version: str) -> Patched:
        if version not in _STATE:
            package = runner_tree(version, tmp_path_factory.mktemp(f"runner-{version}"))
            tree = resolve_target(str(package))
            state = Patched(package=package, pristine=executor_texts(package), first=run(tree, Mode.APPLY, ("runner",)))
            state.diffs = {Path(c.rel).stem: unified_diff(c) for c in state.first.changes}
            write_changes(state.first.changes)
            state.second = run(tree, Mode.APPLY, ("runner",))
            state.verify = run(tree, Mode.VERIFY, ("runner",))
            for change in state.first.changes:
                state.reverted[Path(change.rel).stem] = revert_text(
                    change.source.path.read_text(encoding="utf-8"), change.source.path
                )
            _STATE[version] = state
        return _STATE[version]

    return make


def row(result) -> Any:
    [found] = [m for m in result.models if m.model == "runner"]
    return found


# -- golden diffs, idempotence, revert ----------------------------------------------


@pytest.mark.parametrize("case", [f"{v}/{f}" for v in FIXED for f in RUNNER_FILES])
def test_golden_runner_file(case: str, patched, update_golden: bool) -> None:
    version, stem = case.split("/")
    state = patched(version)
    assert row(state.first).status == ModelStatus.PATCHED, row(state.first).message
    golden = GOLDEN / version / f"{stem}.diff"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(state.diffs[stem].encode("utf-8"))
    assert state.diffs[stem] == golden.read_bytes().decode("utf-8"), f"{case}: diff differs from golden"
    change = next(c for c in state.first.changes if Path(c.rel).stem == stem)
    compile(change.after, change.rel, "exec", dont_inherit=True)
    # Idempotent: the second apply finds every edit present and changes nothing.
    assert not state.second.changes and row(state.second).status == ModelStatus.ALREADY
    assert all(e.status == "present" for e in row(state.second).edits)
    verified = row(state.verify)
    assert verified.status == ModelStatus.ALREADY and verified.compiles and verified.idempotent
    # Revert: byte-identical to the release.
    assert state.reverted[stem].encode("utf-8") == state.pristine[f"{stem}.py"]


def test_revert_through_the_pipeline_is_byte_identical(tmp_path: Path) -> None:
    package = runner_tree("0.5.6", tmp_path)
    pristine = executor_texts(package)
    tree = resolve_target(str(package))
    write_changes(run(tree, Mode.APPLY, ("runner",)).changes)
    assert executor_texts(package) != pristine
    reverted = run(tree, Mode.REVERT, ("runner",))
    assert row(reverted).status == ModelStatus.REVERTED
    write_changes(reverted.changes)
    assert executor_texts(package) == pristine
    assert row(run(tree, Mode.REVERT, ("runner",))).status == ModelStatus.NOT_PATCHED


def test_bare_cr_runner_files_keep_their_last_line_ending(tmp_path: Path) -> None:
    """libcst prints a module ending in a bare CR back without it: the file's last byte must survive."""
    package = runner_tree("0.5.6", tmp_path)
    directory = package / "srt" / "model_executor"
    for path in directory.rglob("*.py"):
        path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r"))
    pristine = executor_texts(package)
    tree = resolve_target(str(package))
    changes = run(tree, Mode.APPLY, ("runner",)).changes
    assert changes
    for change in changes:
        assert change.after.endswith("\r") and "\n" not in change.after, change.rel
    write_changes(changes)
    write_changes(run(tree, Mode.REVERT, ("runner",)).changes)
    assert executor_texts(package) == pristine


@pytest.mark.parametrize("version", UNAFFECTED)
def test_not_needed_where_the_defect_is_absent(version: str, patched) -> None:
    state = patched(version)
    assert not state.first.changes
    found = row(state.first)
    assert found.status == ModelStatus.NOT_NEEDED and found.message.startswith("not needed"), found
    assert row(state.verify).status == ModelStatus.NOT_NEEDED


# -- the static proof ------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    kind: str  # "setter" | "assign" | "capture"
    where: str
    arg: Optional[str] = None  # a setter's first argument ("" when it has none)
    graph_runner: bool = False  # the call sits in a *GraphRunner class


class Program:
    """The classes and module functions of ``model_executor/``, linearised on demand.

    ``events(cls, method)`` walks a method in source order: both branches
    of every ``if``, loop bodies once, lambdas where they stand. A call
    ``self.m()`` is replaced by the events of ``m`` (the class's own or a
    base's), a call of a module function by its events, and a reference to
    a ``*GraphRunner`` class by its ``__init__`` (which ends in
    ``self.capture()``). That over-approximates what can run, in order,
    which is what "no setter call can run before capture" needs.
    """

    def __init__(self, directory: Path) -> None:
        self.classes: dict[str, ast.ClassDef] = {}
        self.functions: dict[str, list[ast.FunctionDef]] = {}
        for path in sorted(directory.rglob("*.py")):
            module = ast.parse(path.read_text(encoding="utf-8-sig"))
            for node in module.body:
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, node)
                elif isinstance(node, ast.FunctionDef):
                    self.functions.setdefault(node.name, []).append(node)
        self._memo: dict[tuple[str, str], list[Event]] = {}

    def method(self, cls: str, name: str, seen: frozenset = frozenset()) -> Optional[tuple[str, ast.FunctionDef]]:
        node = self.classes.get(cls)
        if node is None or cls in seen:
            return None
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == name:
                return cls, item
        for base in node.bases:
            base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            found = self.method(base_name, name, seen | {cls})
            if found:
                return found
        return None

    def events(self, cls: str, func: ast.FunctionDef, stack: tuple = ()) -> list[Event]:
        key = (cls, f"{func.name}:{func.lineno}")
        if key in self._memo:
            return self._memo[key]
        if key in stack or len(stack) > 40:
            return []
        walker = _Walker(self, cls, stack + (key,))
        for stmt in func.body:
            walker.visit(stmt)
        self._memo[key] = walker.events
        return walker.events

    def construct(self, cls: str, stack: tuple) -> list[Event]:
        found = self.method(cls, "__init__")
        events = self.events(found[0], found[1], stack) if found else []
        if not any(e.kind == "capture" for e in events):
            events = events + [Event("capture", f"{cls}(...)")]
        return events


class _Walker(ast.NodeVisitor):
    def __init__(self, program: Program, cls: str, stack: tuple) -> None:
        self.program, self.cls, self.stack = program, cls, stack
        self.events: list[Event] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        return  # a nested def runs later, if ever

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self._assigned([node.target])

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        self._assigned(node.targets)

    def _assigned(self, targets: list) -> None:
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                self.events.append(Event("assign", f"{self.cls}: self.{target.attr}", target.attr))

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id.endswith("GraphRunner") and node.id in self.program.classes:
            self.events.extend(self.program.construct(node.id, self.stack))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            self.visit(arg)
        where = f"{self.cls}:{node.lineno}"
        if isinstance(func, ast.Attribute) and func.attr == SETTER:
            self.visit(func.value)
            arg = (
                ast.unparse(node.args[0]) if node.args else ast.unparse(node.keywords[0].value) if node.keywords else ""
            )
            self.events.append(Event("setter", where, arg, self.cls.endswith("GraphRunner")))
            return
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            if func.attr == "capture" and self.cls.endswith("GraphRunner"):
                self.events.append(Event("capture", where))
                return
            found = self.program.method(self.cls, func.attr)
            if found:
                self.events.extend(self.program.events(found[0], found[1], self.stack))
            return
        if isinstance(func, ast.Attribute) and func.attr == "__init__" and isinstance(func.value, ast.Call):
            node_cls = self.program.classes.get(self.cls)
            for base in node_cls.bases if node_cls else ():
                if isinstance(base, ast.Name):
                    found = self.program.method(base.id, "__init__")
                    if found:
                        self.events.extend(self.program.events(found[0], found[1], self.stack))
                        break
            return
        if isinstance(func, ast.Name) and len(self.program.functions.get(func.id, ())) == 1:
            self.events.extend(self.program.events(self.cls, self.program.functions[func.id][0], self.stack))
            return
        self.visit(func)


def _reads_runner_ids(arg: str) -> bool:
    return f'"{KEY}"' in arg or f"'{KEY}'" in arg or arg.endswith(f".{KEY}")


def before_capture(events: list[Event]) -> list[Event]:
    for index, event in enumerate(events):
        if event.kind == "capture":
            return events[:index]
    return events


def static_proof(directory: Path) -> list[str]:
    """Why graph capture could miss the configured ids (an empty list: it cannot)."""
    program = Program(directory)
    calls = [
        (path, node)
        for path in sorted(directory.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8-sig")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == SETTER
    ]
    if not any(node.args or node.keywords for _, node in calls):
        return []  # no configured ids at all (the setter takes none): nothing can lose them
    problems = [f"{p.name}:{n.lineno}: {SETTER}() without ids" for p, n in calls if not (n.args or n.keywords)]
    problems += [
        f"{p.name}:{n.lineno}: passes {ast.unparse(n.args[0])}, not the configured ids"
        for p, n in calls
        if n.args and KEY not in ast.unparse(n.args[0])
    ]
    runner = "ModelRunner"
    methods = [f for f in program.classes[runner].body if isinstance(f, ast.FunctionDef)]
    startup = program.events(runner, next(f for f in methods if f.name == "__init__"))
    assigned = {e.arg for e in before_capture(startup) if e.kind == "assign"}
    entries = [("start-up", startup)] + [(f.name, program.events(runner, f)) for f in methods if f.name != "__init__"]
    for name, events in entries:
        if not any(e.kind == "capture" for e in events):
            continue
        for event in before_capture(events):
            if event.kind != "setter":
                continue
            if KEY not in (event.arg or ""):
                problems.append(f"{name}: {event.where}: {SETTER}({event.arg}) runs before graph capture")
            elif _reads_runner_ids(event.arg or "") and KEY not in assigned:
                problems.append(f"{name}: {event.where}: reads the runner's ids before start-up assigns them")
            if event.graph_runner and not _reads_runner_ids(event.arg or ""):
                problems.append(f"{name}: {event.where}: the graph runner does not pass the runner's configured ids")
    if any(e.kind == "capture" for e in startup):
        configured = [
            e
            for e in before_capture(startup)
            if (e.kind == "assign" and e.arg == KEY) or (e.kind == "setter" and KEY in (e.arg or ""))
        ]
        if not configured:
            problems.append("start-up: the configured ids reach no graph capture (none is set before the first one)")
    return sorted(set(problems))


@pytest.mark.parametrize("version", MATRIX)
def test_static_proof_after_apply(version: str, patched) -> None:
    """No setter call in model_executor/ can run before graph capture without the configured ids."""
    state = patched(version)
    directory = state.package / "srt" / "model_executor"
    assert static_proof(directory) == []
    program = Program(directory)
    setters = [
        e
        for f in program.classes["ModelRunner"].body
        if isinstance(f, ast.FunctionDef)
        for e in program.events("ModelRunner", f)
        if e.kind == "setter"
    ]
    if version == "0.4.6":
        assert all(e.arg == "" for e in setters)  # the legacy setter: no ids exist to lose
        assert row(state.first).status == ModelStatus.NOT_NEEDED
    else:
        # The explicit configuration is on the start-up path, and so is a graph capture or the
        # capture is elsewhere (0.5.15+: the scheduler calls init_cuda_graphs) and sets no ids.
        assert any(KEY in (e.arg or "") for e in setters)
        graph_setters = [e for e in setters if e.graph_runner]
        assert all(_reads_runner_ids(e.arg or "") for e in graph_setters)
        assert bool(graph_setters) == (version in FIXED)


@pytest.mark.parametrize("version", FIXED)
def test_static_proof_fails_on_the_unpatched_release(version: str, tmp_path: Path) -> None:
    problems = static_proof(runner_tree(version, tmp_path) / "srt" / "model_executor")
    assert any("without ids" in p for p in problems), problems
    assert any("runs before graph capture" in p for p in problems), problems


# -- run the patched code on stand-ins for CUDA ---------------------------------------------

KEEP_CALLS = {"init_device_graphs", "init_cuda_graphs", "kernel_warmup", "_dummy_run", "capture"}


def _keeps(node: ast.AST) -> bool:
    """Statements the stand-in run needs: ids, setter calls, graph runners and capture."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr == SETTER:
                return True
            if sub.func.attr in KEEP_CALLS and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "self":
                return True
        if isinstance(sub, (ast.Assign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            if any(isinstance(t, ast.Attribute) and t.attr.startswith("eagle_") for t in targets):
                return True
        if isinstance(sub, ast.Name) and sub.id.endswith("GraphRunner"):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr.endswith("graph_runner"):
            return True
    return False


def _names(node: ast.AST, ctx: type) -> set[str]:
    found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}
    if ctx is ast.Store:
        found |= {h.name for h in ast.walk(node) if isinstance(h, ast.ExceptHandler) and h.name}
    return found


def slice_body(stmts: list) -> list:
    """The statements ``_keeps`` wants, inner blocks sliced, plus what defines their locals."""
    kept = {i: _sliced(s) for i, s in enumerate(stmts) if _keeps(s)}
    grown = True
    while grown:
        grown = False
        for i, stmt in enumerate(stmts):
            later = set().union(*(_names(kept[j], ast.Load) for j in kept if j > i))
            if i not in kept and _names(stmt, ast.Store) & later:
                kept[i], grown = stmt, True
    return [kept[i] for i in sorted(kept)]


def _sliced(stmt: ast.stmt) -> ast.stmt:
    if not isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
        return stmt
    stmt = copy.copy(stmt)
    stmt.body = slice_body(stmt.body) or [ast.Pass()]
    if getattr(stmt, "orelse", None):
        stmt.orelse = slice_body(stmt.orelse)
    if isinstance(stmt, ast.Try):
        stmt.handlers = [copy.copy(h) for h in stmt.handlers]
        for handler in stmt.handlers:
            handler.body = slice_body(handler.body) or [ast.Pass()]
        stmt.finalbody = slice_body(stmt.finalbody)
    return stmt


def sliced_function(func: ast.FunctionDef, namespace: dict) -> Callable:
    """``func`` cut down by :func:`slice_body`, compiled in ``namespace``; every parameter defaults to None."""
    node = copy.deepcopy(func)
    node.decorator_list, node.returns = [], None
    params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
    for param in params:
        param.annotation = None
    node.args.defaults = [ast.Constant(None)] * (len(node.args.posonlyargs + node.args.args) - 1)
    node.args.kw_defaults = [ast.Constant(None)] * len(node.args.kwonlyargs)
    node.body = slice_body(func.body) or [ast.Pass()]
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    exec(compile(module, f"<sliced {func.name}>", "exec"), namespace)
    return namespace[func.name]  # type: ignore[no-any-return]


class Anything:
    """Stands in for torch, loggers and the rest: every use is a no-op and falsy."""

    def __init__(self, name: str = "?") -> None:
        self._name = name

    def __getattr__(self, item: str) -> "Anything":
        return Anything(f"{self._name}.{item}")

    def __call__(self, *args: Any, **kwargs: Any) -> "Anything":
        return Anything(f"{self._name}()")

    def __enter__(self) -> "Anything":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def __bool__(self) -> bool:
        return False

    def __getitem__(self, key: Any) -> "Anything":
        return Anything(f"{self._name}[]")


class StandInGlobals(dict):
    def __missing__(self, key: str) -> Any:
        return getattr(builtins, key) if hasattr(builtins, key) else Anything(key)


class SpecAlgorithm:
    def is_eagle3(self) -> bool:
        return True

    def is_eagle(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Callable[[], bool]:
        return lambda: False


class DraftModelConfig:
    """``ModelConfig.from_server_args(..., is_draft_model=True)``: a draft asking for the embedding."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.hf_config = types.SimpleNamespace(eagle_config={KEY: list(IDS), "use_aux_hidden_state": True})

    @classmethod
    def from_server_args(cls, *args: Any, **kwargs: Any) -> "DraftModelConfig":
        return cls()


class RecordingModel:
    """The target model: records what its setter receives and what each capture sees."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.layers: Any = "unset"

    def set_eagle3_layers_to_capture(self, layer_ids: Any = None) -> None:
        self.log.append(("set", None if layer_ids is None else list(layer_ids)))
        self.layers = "default" if layer_ids is None else list(layer_ids)


@dataclass
class Observed:
    log: list

    @property
    def captures(self) -> list:
        return [value for kind, value in self.log if kind == "capture"]

    @property
    def setter_ids(self) -> list:
        return [value for kind, value in self.log if kind == "set"]


def run_on_standins(directory: Path, recapture: bool) -> Observed:
    """Start the real (sliced) runner code: start-up with warm-up, then a weight update if asked."""
    program = Program(directory)
    log: list = []
    namespace = StandInGlobals(ModelConfig=DraftModelConfig, defaultdict=collections.defaultdict)
    graph_init = sliced_function(program.method("CudaGraphRunner", "__init__")[1], namespace)

    class CudaGraphRunner:
        def __init__(self, model_runner: Any) -> None:
            self.model_runner = model_runner
            graph_init(self, model_runner)

        def capture(self) -> None:
            log.append(("capture", self.model_runner.model.layers))

        def __getattr__(self, name: str) -> Anything:  # its own buffers and settings
            return Anything(f"graph_runner.{name}")

    namespace["CudaGraphRunner"] = CudaGraphRunner
    methods: dict[str, Any] = {}
    for name in (
        "__init__",
        "initialize",
        "init_device_graphs",
        "init_cuda_graphs",
        "_dummy_run",
        "update_weights_from_disk",
    ):
        found = program.method("ModelRunner", name)
        if found:
            methods[name if name != "__init__" else "real_init"] = sliced_function(found[1], namespace)

    def kernel_warmup(self: Any) -> None:  # as if the FlashInfer autotune warm-up is on
        if "_dummy_run" in methods:
            self._dummy_run(1)

    runner_cls = type("ModelRunner", (), {**methods, "kernel_warmup": kernel_warmup})
    runner = runner_cls()
    runner.device, runner.is_draft_worker, runner.is_generation = "cuda", False, True
    runner.spec_algorithm, runner.server_args = SpecAlgorithm(), Anything("server_args")
    runner.model = RecordingModel(log)
    runner.real_init(server_args=runner.server_args)
    runner.initialize(1.0)
    if recapture:
        log.append(("update_weights", None))
        runner.update_weights_from_disk("new-weights", "auto", recapture_cuda_graph=True)
    return Observed(log)


@pytest.mark.parametrize("version", FIXED)
def test_patched_graph_capture_uses_the_configured_ids_on_standins(version: str, patched) -> None:
    state = patched(version)
    directory = state.package / "srt" / "model_executor"
    recapture = "recapture_cuda_graph" in (directory / "model_runner.py").read_text(encoding="utf-8")
    observed = run_on_standins(directory, recapture)
    assert observed.captures, observed.log
    assert all(layers == IDS for layers in observed.captures), observed.log
    # Warm-up (from 0.5.6), graph runner and the explicit call: all pass the draft's ids.
    assert observed.setter_ids and all(ids == IDS for ids in observed.setter_ids), observed.log
    if recapture:  # 0.5.6, 0.5.10: update_weights_from_disk(recapture_cuda_graph=True)
        after = observed.log[observed.log.index(("update_weights", None)) :]
        assert ("capture", IDS) in after, observed.log
    if version in ("0.5.6", "0.5.10"):
        first_capture = observed.log.index(("capture", IDS))
        assert len([e for e in observed.log[:first_capture] if e[0] == "set"]) >= 2, observed.log  # _dummy_run too


@pytest.mark.parametrize("version", FIXED)
def test_unpatched_graph_capture_uses_the_defaults_on_standins(version: str, tmp_path: Path) -> None:
    """The same harness shows the bug on the release as shipped."""
    directory = runner_tree(version, tmp_path) / "srt" / "model_executor"
    recapture = "recapture_cuda_graph" in (directory / "model_runner.py").read_text(encoding="utf-8")
    observed = run_on_standins(directory, recapture)
    assert observed.captures and all(layers == "default" for layers in observed.captures), observed.log
    assert observed.setter_ids[-1] == (None if recapture else IDS)  # a recapture even loses the eager ids


# -- the pipeline and the CLI -----------------------------------------------------------


def patchcraft(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "patchcraft", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_cli_row_json_and_no_runner(tmp_path: Path) -> None:
    package = runner_tree("0.5.10", tmp_path)
    pristine = executor_texts(package)
    skipped = patchcraft("apply", "--no-runner", "--format", "json", str(package))
    assert skipped.returncode == 0, skipped.stderr
    assert json.loads(skipped.stdout)["models"] == [] and executor_texts(package) == pristine
    check = patchcraft("verify", "--format", "json", str(package))
    assert check.returncode == 1
    [entry] = json.loads(check.stdout)["models"]
    assert (entry["model"], entry["status"], entry["idempotent"]) == ("runner", ModelStatus.WOULD, False)
    assert {e["transform"] for e in entry["edits"]} == {transform.NAME}
    applied = patchcraft("apply", str(package))
    assert applied.returncode == 0 and "runner  added: configured ids reach graph capture" in applied.stderr
    verified = patchcraft("verify", str(package))
    assert verified.returncode == 0 and "configured ids reach graph capture" in verified.stderr
    assert patchcraft("diff", "--no-runner", str(package)).stdout == ""
    assert patchcraft("revert", "--no-runner", str(package)).returncode == 0 and executor_texts(package) != pristine
    assert patchcraft("revert", str(package)).returncode == 0 and executor_texts(package) == pristine


def test_model_names_bring_the_runner_and_single_files_leave_it_out(tmp_path: Path) -> None:
    """A model patched for -1 still decodes with the default layers without the runner fix."""
    package = runner_tree("0.5.10", tmp_path)
    model = package / "srt" / "models" / "deepseek_v2.py"
    shutil.copy2(release_package("0.5.10") / "srt" / "models" / "deepseek_v2.py", model)
    tree = resolve_target(str(package))
    assert [m.model for m in run(tree, Mode.CHECK, ("deepseek_v2",)).models] == [
        "deepseek_v2.DeepseekV2ForCausalLM",
        "runner",
    ]
    assert [m.model for m in run(tree, Mode.CHECK, ("deepseek_v2",), runner=False).models] == [
        "deepseek_v2.DeepseekV2ForCausalLM"
    ]
    assert [m.model for m in run(tree, Mode.CHECK, ("runner",)).models] == ["runner"]
    assert "runner" not in [m.model for m in run(resolve_target(str(model)), Mode.CHECK).models]


def _edit(package: Path, name: str, old: str, new: str) -> None:
    path = package / "srt" / "model_executor" / name
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_a_hand_changed_call_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    package = runner_tree("0.5.6", tmp_path)
    tree = resolve_target(str(package))
    write_changes(run(tree, Mode.APPLY, ("runner",)).changes)
    _edit(
        package,
        "cuda_graph_runner.py",
        'getattr(self.model_runner, "eagle_aux_hidden_state_layer_ids", None)',
        "[2, 30, 58]",
    )
    before = executor_texts(package)
    result = patchcraft("apply", str(package))
    assert result.returncode == 1, result.stderr  # the runner row is in error; nothing else here to write
    assert "runner" in result.stderr and "changed by hand" in result.stderr
    assert executor_texts(package) == before


def test_unusual_spacing_is_refused_not_reverted_wrongly(tmp_path: Path) -> None:
    package = runner_tree("0.5.10", tmp_path)
    _edit(
        package, "cuda_graph_runner.py", f"self.model_runner.model.{SETTER}()", f"self.model_runner.model.{SETTER}( )"
    )
    before = executor_texts(package)
    result = run(resolve_target(str(package)), Mode.APPLY, ("runner",))
    assert row(result).status == ModelStatus.ERROR and "nothing between its parentheses" in row(result).message
    assert not result.changes and executor_texts(package) == before


RUNNER_SHAPES = (
    "class R:\n    def load(self):\n        self.model.set_eagle3_layers_to_capture(ids)\n",
    "class R:\r\n    def load(self):\r\n        x = 'é€'; self.model.set_eagle3_layers_to_capture(\r\n"
    "            [i for i in ids],  # patchcraft: pass the ids\r\n        )\r\n",
    "class R:\n    def load(self):\n        \x0c\n        def inner():\n            self.m.set_eagle3_layers_to_capture(  # x\n"
    "                ids)  # patchcraft: outside the call\n        self.m.set_eagle3_layers_to_capture()\n"
    "self.m.set_eagle3_layers_to_capture()\n",
)


@pytest.mark.parametrize("text", RUNNER_SHAPES)
def test_a_setter_calls_source_is_what_ast_gives(text: str) -> None:
    """The runner's calls are read from lines split once: each call's text, function and mark are ast's own."""
    from patchcraft.planning import runner_edits

    module = ast.parse(text)
    calls = list(runner_edits._calls_in(Path("r.py"), text, module))
    lines = runner_edits._lines(text)
    assert calls and {id(c.node) for c in calls} == {
        id(n) for n in ast.walk(module) if isinstance(n, ast.Call) and runner_edits._is_setter_call(n)
    }
    for call in calls:
        segment = ast.get_source_segment(text, call.node)
        assert runner_edits._segment(lines, call.node) == segment
        assert call.marked == (runner_edits.MARKER in segment)
    assert [c.function for c in calls] == {
        0: ["load"],
        1: ["load"],
        2: ["inner", "load", None],
    }[RUNNER_SHAPES.index(text)]
    assert [c.marked for c in calls][:1] == [RUNNER_SHAPES.index(text) == 1]
