"""Which hidden states does SGLang really capture for a list of aux layer ids?

The answer depends on the release and the model: the setter's id
conversion (+1 rule, first-id or max heuristic, inner helper, delegation),
which boundaries the inner model's ``forward`` can capture, whether the
install is patched for -1, and whether the model runner resets the ids
before CUDA-graph capture. This module reads all of that statically:

- the model class and its edit sites come from the engine's plan
  (:mod:`patchcraft.planning.model_plans`);
- the setter that really runs is executed on stand-ins
  (:mod:`patchcraft.reading.setter_sandbox`), so the conversion is the release's own;
- "patched" is the engine's verify verdict on the plan's sites
  (:func:`patchcraft.engine.file_patch.patch_text`); the same call gives the patched
  text, which answers "what would these ids do after ``patchcraft apply``";
- the runner reset is found structurally in ``srt/model_executor/``.

Hidden states are numbered as Hugging Face does: ``hs[0]`` is the embedding
output and ``hs[k]`` the output of decoder layer ``k-1``. A
``layers_to_capture`` value ``v`` is boundary ``v``: a capture at the top
of layer ``v`` (or after layer ``v-1``) yields ``hs[v]``.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.class_graph import SETTER, ClassNode, ModelGraph, classes_assigned_to, read_setter
from patchcraft.planning.records import EditSite, ModelPlan
from patchcraft.engine.file_patch import patch_text
from patchcraft.planning.model_plans import plan_model, plan_models, scan
from patchcraft.planning.runner_edits import setter_calls
from patchcraft.planning.selection import named, no_match
from patchcraft.base.sources import read_source
from patchcraft.reading.setter_sandbox import Config, Layer, NotEvaluable, Pipeline, SetterRun, run_setter
from patchcraft.base.status import EDIT_IN_PLACE
from patchcraft.base.target import SglangTree

if TYPE_CHECKING:
    from patchcraft.harness.served import RunOutcome

#: The source of the served states: the code ran on the CPU harness, or the static reading.
RUN, STATIC = "run", "static"


def hs(index: int) -> str:
    return f"hs[{index}]"


def describe_state(index: int) -> str:
    """``hs[0]`` is the embedding output, ``hs[k]`` the output of layer ``k-1``."""
    return "embedding output" if index == 0 else f"output of layer {index - 1}"


def states_text(states: Iterable[int]) -> str:
    items = [hs(s) for s in states]
    return ", ".join(items) if items else "nothing"


# -- the model and its install ---------------------------------------------------


@dataclass
class Model:
    """One model class of one SGLang tree, with what the engine says about it."""

    tree: SglangTree
    graph: ModelGraph
    cls: ClassNode
    plan: ModelPlan
    patched: bool
    patch_detail: str
    patched_texts: dict[Path, str] = field(default_factory=dict)
    _patched_graph: ModelGraph | None = None

    @property
    def label(self) -> str:
        return self.cls.label

    def patched_graph(self) -> ModelGraph:
        """The graph as it will be after ``patchcraft apply`` (patched text, in memory)."""
        if self.patched or not self.patched_texts:
            return self.graph
        if self._patched_graph is None:
            graph = ModelGraph(models_dir=self.graph.models_dir)
            for path, text in self.patched_texts.items():
                graph.load(path.stem, text.encode("utf-8"))
            self._patched_graph = graph
        return self._patched_graph


def load_model(tree: SglangTree, name: str | None) -> Model:
    """Find model ``name`` (file stem, class, or ``module.Class``) in ``tree``."""
    if not tree.models_dir.is_dir():
        raise PatchcraftError(f"{tree.package}: not an SGLang tree (no srt/models)")
    stem = name.lower().removesuffix(".py") if name else ""
    if "." in stem and (tree.models_dir / f"{stem.split('.')[0]}.py").is_file():
        stem = stem.split(".")[0]  # module.Class: that module's classes are enough, as for a file stem
    if stem and (tree.models_dir / f"{stem}.py").is_file():
        # A model file: its classes and what they import are enough (loaded on demand).
        graph = ModelGraph(models_dir=tree.models_dir)
        graph.load(stem)
        for cls in list(graph.classes.values()):
            graph.mro(cls)  # load the bases' files: an inherited setter makes a model class
    else:
        graph = scan(tree.models_dir)
    plans = plan_models(graph, inheriting=True)  # a fork's entry class that only inherits a setter has a row
    cls = _choose_class(tree, graph, plans, name)
    plan = plan_model(graph, cls)
    patched, detail, texts = _patch_state(plan)
    return Model(tree=tree, graph=graph, cls=cls, plan=plan, patched=patched, patch_detail=detail, patched_texts=texts)


def _choose_class(tree: SglangTree, graph: ModelGraph, plans: list[ModelPlan], name: str | None) -> ClassNode:
    chosen = named(plans, [name] if name else [])
    if len(chosen) > 1:
        # One module, several model classes (an MTP head next to the model): take the supported one.
        exact = [p for p in chosen if name and p.cls.lower() == name.lower()]
        supported = [p for p in chosen if not p.unsupported]
        chosen = exact or (supported if len(supported) == 1 else chosen)
    if len(chosen) == 1:
        return graph.classes[(chosen[0].module, chosen[0].cls)]
    if name and not chosen:
        found = _class_by_name(graph, name)
        if found is not None:
            return found
        raise PatchcraftError(f"{tree.models_dir}: {no_match(tree.models_dir, [name])}")
    names = ", ".join(p.label for p in chosen[:8]) + (", ..." if len(chosen) > 8 else "")
    raise PatchcraftError(f"{len(chosen)} model classes match; pass --model NAME (one of: {names})")


def _class_by_name(graph: ModelGraph, name: str) -> ClassNode | None:
    """A class with a setter in its MRO, found by its name (e.g. an architecture)."""
    bare = name.split(".")[-1]
    pattern = re.compile(rb"^class\s+" + re.escape(bare.encode()) + rb"\b", re.M)
    for path in sorted(graph.models_dir.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if pattern.search(data) and graph.load(path.stem):
            cls = graph.classes.get((path.stem, bare))
            if cls is not None and graph.find_method(cls, SETTER) is not None:
                return cls
    return None


def _patch_state(plan: ModelPlan) -> tuple[bool, str, dict[Path, str]]:
    """The engine's verify verdict for ``plan``, and the text ``apply`` would write."""
    if plan.unsupported:
        return False, f"unsupported: {plan.unsupported}", {}
    by_file: dict[Path, list[EditSite]] = {}
    for site in plan.sites:
        by_file.setdefault(site.path, []).append(site)
    statuses: list[str] = []
    texts: dict[Path, str] = {}
    for path, sites in by_file.items():
        text = read_source(path).text
        patch = patch_text(text, path, sites)
        if patch.errors:
            return (
                False,
                f"not patched for -1, and `patchcraft apply` cannot patch it: {next(iter(patch.errors.values()))}",
                {},
            )
        statuses += [patch.outcomes[s.key].status for s in sites]
        if patch.after != text:
            texts[path] = patch.after
    if all(s in EDIT_IN_PLACE for s in statuses):
        return True, "patched for -1", {}
    kinds = [site.kind for sites in by_file.values() for site in sites]
    missing = sorted({kind for kind, status in zip(kinds, statuses) if status not in EDIT_IN_PLACE})
    return False, f"not patched for -1: {', '.join(missing)} edit missing", texts


# -- what the forward can capture ------------------------------------------------


def reachable(graph: ModelGraph, holder: ClassNode | None, num_layers: int, marks: bool = True) -> frozenset[int]:
    """The ``layers_to_capture`` values the inner model's forward ever captures.

    Each ``X in self.layers_to_capture`` test in ``forward`` is evaluated
    over the layer loop: ``i`` gives 0..n-1 (top of layer i), ``i + 1``
    gives 1..n (after layer i), ``self.start_layer`` gives 0 and
    ``num_layers`` or ``self.end_layer`` gives n. A forward that gates on
    the ``_is_layer_to_capture`` marks captures at the top of the layers
    the setter marked: 0..n-1, or nothing when the setter that ran sets no
    mark (``marks`` False: Qwen3.5's EAGLE-3 setter, where only the DFLASH
    setter marks layers). A forward with neither captures nothing.
    """
    loop_top = frozenset(range(num_layers))
    found = graph.find_method(holder, "forward") if holder is not None else None
    if found is None:
        return loop_top
    forward = found[1]
    loop_vars = _loop_variables(forward)
    values: set[int] = set()
    tests = 0
    for node in ast.walk(forward):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In)):
            continue
        target = node.comparators[0]
        if not (isinstance(target, ast.Attribute) and target.attr == "layers_to_capture"):
            continue
        tests += 1
        values |= _boundaries(node.left, loop_vars, num_layers)
    if tests:
        return frozenset(values)
    # Layers marked by the setter (``_is_layer_to_capture``) capture at their top; a
    # forward with neither test nor mark never captures (the plan reports it too).
    return loop_top if marks and "_is_layer_to_capture" in ast.dump(forward) else frozenset()


def _sets_marks(run: SetterRun) -> bool:
    """Whether a setter that ran marks layers (``layer._is_layer_to_capture = ...``)."""
    return any("_is_layer_to_capture" in ast.dump(call.func) for call in run.calls)


def _forward_text(graph: ModelGraph, holder: ClassNode | None) -> str:
    found = graph.find_method(holder, "forward") if holder is not None else None
    return ast.dump(found[1]) if found is not None else ""


def _loop_variables(func: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.For):
            targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


class _Self:
    """``self`` of an inner model, for evaluating a capture test's left side."""

    def __init__(self, num_layers: int) -> None:
        self.start_layer = 0
        self.end_layer = num_layers
        self.layers = [Layer() for _ in range(num_layers)]
        self.config = Config(num_layers)
        self.pp_group = Pipeline()


def _boundaries(expr: ast.expr, loop_vars: set[str], num_layers: int) -> set[int]:
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    code = compile(ast.Expression(body=expr), "<capture test>", "eval")
    scope = {"__builtins__": {"len": len}, "self": _Self(num_layers), "num_layers": num_layers}
    uses_loop = names & loop_vars
    try:
        if uses_loop:
            return {int(eval(code, scope, {v: i for v in uses_loop})) for i in range(num_layers)}  # noqa: S307
        return {int(eval(code, scope))}  # noqa: S307
    except Exception:  # an expression we cannot evaluate: assume the loop top
        return set(range(num_layers))


# -- the CUDA-graph reset ----------------------------------------------------------


@dataclass(frozen=True)
class RunnerReset:
    """A ``set_eagle3_layers_to_capture()`` call with no ids in the model runner."""

    file: str
    line: int
    function: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


def runner_resets(tree: SglangTree) -> tuple[RunnerReset, ...]:
    """Calls in ``srt/model_executor/`` that reset the ids to the defaults.

    In 0.4.10-0.5.10 the CUDA-graph runner (and ``_dummy_run`` from 0.5.6)
    makes this call before graph capture, so the replayed graphs capture
    the default layers whatever the draft config says. The runner
    transform gives every such call the configured ids, so on a patched
    runner none is left; from 0.5.13 there is none to begin with. The calls
    are the runner planner's (:func:`patchcraft.planning.runner_edits.setter_calls`);
    a file that does not parse is passed over.
    """
    directory = tree.executor_dir
    if not directory.is_dir():
        return ()
    found = [
        RunnerReset(tree.relative(call.path), call.node.lineno, call.function)
        for call in setter_calls(directory, strict=False)
        if not call.has_ids and call.function is not None
    ]
    return tuple(sorted(found, key=lambda r: (r.file, r.line)))


# -- one explanation ---------------------------------------------------------------


@dataclass(frozen=True)
class IdRow:
    """One requested id: its ``layers_to_capture`` value and the state captured."""

    layer_id: int
    value: int | None  # None: -1 became the embedding flag
    state: int | None  # None: never captured
    note: str = ""


@dataclass(frozen=True)
class Served:
    """What the draft is fed for one id list: the states, in forward order."""

    run: SetterRun
    states: tuple[int, ...]
    reachable: frozenset[int]
    #: Why the static reading cannot tell what is served ("" when it can): the run decides.
    unknown: str = ""

    @property
    def unsafe_embedding(self) -> bool:
        """``hs[0]`` comes from ``layers_to_capture`` 0, not from patchcraft's cloned capture."""
        return 0 in (self.run.layers_to_capture or ()) and 0 in self.reachable


@dataclass(frozen=True)
class Finding:
    """One warning: ``kind`` says what it is about (check-draft sorts on it)."""

    kind: str  # "startup" | "legacy" | "range" | "heuristic" | "embedding" | "cuda-graph" | "fusion"
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Explanation:
    """Everything ``patchcraft explain`` reports for one model and one id list."""

    version: str
    package: str
    model: str
    setter: str
    calls: tuple[str, ...]
    variant: str
    rule: str
    patched: bool
    patch_detail: str
    num_layers: int
    layer_ids: tuple[int, ...] | None
    layers_to_capture: tuple[int, ...] | None
    embedding: bool
    rows: tuple[IdRow, ...]
    served: tuple[int, ...]
    default_served: tuple[int, ...]
    resets: tuple[RunnerReset, ...]
    warnings: tuple[Finding, ...]
    notes: tuple[str, ...]
    #: ``run`` (the setter and forward ran on the CPU harness) or ``static`` (read by rules).
    source: str = STATIC
    #: The run with these ids (None: static), and what the static reading says.
    outcome: "RunOutcome | None" = None
    static_served: tuple[int, ...] = ()
    static_unknown: str = ""

    def findings(self, *kinds: str) -> list[Finding]:
        return [w for w in self.warnings if w.kind in kinds]

    @property
    def graph_reset(self) -> bool:
        """CUDA-graph replays will capture the default layers instead."""
        return bool(self.resets)


def serve(model: Model, layer_ids: Sequence[int] | None, num_layers: int, after_apply: bool = False) -> Served:
    """The states SGLang feeds the draft for ``layer_ids`` (None: the default call)."""
    graph = model.patched_graph() if after_apply else model.graph
    cls = graph.classes.get(model.cls.key) if after_apply else model.cls
    if cls is None:  # the class's own module was not patched: load it as it is
        graph.load(model.cls.module)
        cls = graph.classes[model.cls.key]
    try:
        run = run_setter(graph, cls, layer_ids, num_layers)
    except NotEvaluable as exc:
        raise PatchcraftError(f"{model.label}: cannot evaluate the setter statically: {exc}") from None
    reach = reachable(graph, run.holder, num_layers, marks=_sets_marks(run))
    if run.error or run.layers_to_capture is None:
        return Served(run, (), reach)
    loop = sorted({v for v in run.layers_to_capture if v in reach})
    return Served(run, ((0,) if run.embedding else ()) + tuple(loop), reach, _static_unknown(graph, run, reach))


def _static_unknown(graph: ModelGraph, run: SetterRun, reach: frozenset[int]) -> str:
    """Where rules cannot tell what the forward does with these values: say so, never guess."""
    values = run.layers_to_capture or ()
    if 0 in values and 0 in reach:
        return (
            "layers_to_capture 0 is a capture at the top of layer 0, where residual is None: whether the forward "
            "crashes there, aliases the embedding or copies it is not read statically"
        )
    if any(v not in reach for v in values) and "AuxHiddenStatePacker" in _forward_text(graph, run.holder):
        return (
            "the forward's AuxHiddenStatePacker is sized for every id, and fewer are captured: its finalize() may raise"
        )
    if values and _captures_without_residual(graph, run.holder):
        return (
            "the forward appends hidden_states without the residual it carries beside it: "
            "whether that is a layer's full output is not read statically"
        )
    return ""


def _captures_without_residual(graph: ModelGraph, holder: ClassNode | None) -> bool:
    """A capture of bare ``hidden_states`` in a forward whose layers return a separate residual."""
    found = graph.find_method(holder, "forward") if holder is not None else None
    if found is None:
        return False
    forward = found[1]
    carries = any(
        isinstance(node, ast.Name) and node.id == "residual" and isinstance(node.ctx, ast.Store)
        for node in ast.walk(forward)
    )
    if not carries:
        return False
    for node in ast.walk(forward):
        if isinstance(node, ast.If) and "layers_to_capture" in ast.dump(node.test):
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "append"
                    and len(call.args) == 1
                    and isinstance(call.args[0], ast.Name)
                    and call.args[0].id == "hidden_states"
                ):
                    return True
    return False


def run_served(
    model: Model, layer_ids: Sequence[int] | None, num_layers: int, after_apply: bool = False
) -> "RunOutcome | None":
    """Run the setter and forward on the CPU harness (None without torch).

    What runs is what the server would import: the files of ``model``'s
    tree as they are (the install, patched or not, or an overlay's tree),
    or with ``after_apply`` the texts ``patchcraft apply`` would write.
    """
    from patchcraft.harness import torch_problem

    if torch_problem() is not None:
        return None
    from patchcraft.harness.served import run_ids

    texts = model.patched_texts if after_apply else None
    return run_ids(model.tree.package, model.graph, model.plan, layer_ids, num_layers, texts)


def explain(
    model: Model, layer_ids: Sequence[int] | None, num_layers: int, tp: int = 1, run_code: bool = True
) -> Explanation:
    """Explain what ``layer_ids`` capture on ``model``'s install (served at tensor parallelism ``tp``).

    With torch (and ``run_code``), the served states are those the real
    setter and forward feed on the CPU harness; without it, the static
    reading, which says "unknown" where its rules cannot tell.
    """
    if tp < 1:
        raise PatchcraftError(f"--tp must be positive, not {tp}")
    if num_layers < 1:
        raise PatchcraftError(f"--num-layers must be positive, not {num_layers}")
    ids = tuple(layer_ids) if layer_ids is not None else None
    static = serve(model, ids, num_layers)
    outcome = run_served(model, ids, num_layers) if run_code else None
    if outcome is not None and not outcome.ran:
        outcome = None  # the harness cannot follow this model: the static reading stays, and says so
    run = static.run
    default = serve(model, None, num_layers)
    default_run = run_served(model, None, num_layers) if outcome is not None and runner_resets(model.tree) else None
    default_states = (
        default_run.states if default_run is not None and default_run.ran and not default_run.crash else default.states
    )
    served = outcome.states if outcome is not None else static.states
    variant, test = _variant(run)
    facts = _Facts(
        model=model,
        ids=ids,
        run=run,
        rows=_rows(ids, run, static.reachable, outcome),
        served=static,
        default=default,
        variant=variant,
        test=test,
        rule=_rule(ids, run, test),
        resets=runner_resets(model.tree),
        num_layers=num_layers,
        outcome=outcome,
        states=served,
        default_states=default_states,
    )
    warnings, notes = _judge(facts)
    if tp > 1:
        partial = fusion_defect(model)
        if partial:
            warnings.append(Finding("fusion", partial))
    calls = tuple(str(c) for c in run.calls)
    return Explanation(
        version=model.tree.version,
        package=str(model.tree.package),
        model=model.label,
        setter=calls[-1] if calls else model.label,
        calls=calls,
        variant=variant,
        rule=facts.rule,
        patched=model.patched,
        patch_detail=model.patch_detail,
        num_layers=num_layers,
        layer_ids=ids,
        layers_to_capture=run.layers_to_capture,
        embedding=run.embedding,
        rows=facts.rows,
        served=served,
        default_served=default_states,
        resets=facts.resets,
        warnings=tuple(warnings),
        notes=tuple(notes),
        source=RUN if outcome is not None else STATIC,
        outcome=outcome,
        static_served=static.states,
        static_unknown=static.unknown,
    )


@dataclass(frozen=True)
class _Facts:
    """What the warnings are judged from."""

    model: Model
    ids: tuple[int, ...] | None
    run: SetterRun
    rows: tuple[IdRow, ...]
    served: Served
    default: Served
    variant: str
    test: str
    rule: str
    resets: tuple[RunnerReset, ...]
    num_layers: int
    outcome: "RunOutcome | None" = None
    #: What is served (the run's states, or the static reading's) and for the default call.
    states: tuple[int, ...] = ()
    default_states: tuple[int, ...] = ()


def _rows(
    ids: tuple[int, ...] | None, run: SetterRun, reach: frozenset[int], outcome: "RunOutcome | None" = None
) -> tuple[IdRow, ...]:
    """Pair each id with its ``layers_to_capture`` value (the setters keep the order)."""
    if ids is None or run.layers_to_capture is None or not run.takes_ids:
        return ()
    values = list(run.layers_to_capture)
    pairs: list[tuple[int, int | None]]
    if run.embedding and -1 in ids and len(values) == len([i for i in ids if i != -1]):
        rest = iter(values)
        pairs = [(i, None if i == -1 else next(rest)) for i in ids]
    elif len(values) == len(ids):
        pairs = list(zip(ids, values))
    else:
        return ()
    return tuple(_row(layer_id, value, reach, outcome) for layer_id, value in pairs)


def _row(layer_id: int, value: int | None, reach: frozenset[int], outcome: "RunOutcome | None" = None) -> IdRow:
    if value is None:
        return IdRow(layer_id, None, 0, "embedding output (patchcraft capture)")
    if value not in reach:
        return IdRow(layer_id, value, None, "never captured")
    if value == 0:
        return _layer_zero_row(layer_id, outcome)
    return IdRow(layer_id, value, value, describe_state(value))


def _layer_zero_row(layer_id: int, outcome: "RunOutcome | None") -> IdRow:
    """``layers_to_capture`` 0: the run says whether the release crashes, aliases or copies there."""
    if outcome is None:
        return IdRow(
            layer_id, 0, 0, "embedding output if the capture at layer 0 survives residual None (unknown statically)"
        )
    if outcome.crash:
        return IdRow(layer_id, 0, None, f"crash: {outcome.crash}")
    first = outcome.fed[0] if outcome.fed else None
    if first is not None and first.state == 0:
        how = "a copy" if first.copy else "not a copy: layer 0 overwrites it in place"
        return IdRow(layer_id, 0, 0, f"embedding output, {how}")
    return IdRow(layer_id, 0, None, "never captured (run)")


def _variant(run: SetterRun) -> tuple[str, str]:
    """The setter variant that decided the ids, and its heuristic test if any."""
    for call in reversed(run.calls):
        shape = read_setter(call.func)
        if shape.variant in ("first-id-heuristic", "max-heuristic"):
            return shape.variant, _heuristic_test(call.func, shape.param or "layer_ids")
    variants = [read_setter(call.func).variant for call in run.calls]
    if "delegation" in variants and len(variants) > 1:
        return "delegation", ""
    return (variants[-1] if variants else "unknown"), ""


def _heuristic_test(func: ast.AST, param: str) -> str:
    for node in ast.walk(func):
        if isinstance(node, ast.If):
            text = ast.unparse(node.test)
            if param in text and ("max(" in text or f"{param}[" in text):
                return text
    return ""


def _rule(ids: tuple[int, ...] | None, run: SetterRun, test: str) -> str:
    """Name the conversion the setter applied, by comparing its output with the ids."""
    if not run.takes_ids:
        return "the setter takes no ids: always the default layers"
    if ids is None:
        return "no ids: the default layers"
    values = run.layers_to_capture
    if values is None:
        return "the setter set no layers_to_capture"
    kept = [i for i in ids if not (run.embedding and i == -1)]
    suffix = f" (heuristic `{test}`)" if test else ""
    if list(values) == [i + 1 for i in kept]:
        return "+1 rule" + suffix
    if list(values) == kept:
        return "ids kept raw" + suffix
    return "another conversion" + suffix


def _judge(facts: _Facts) -> tuple[list[Finding], list[str]]:
    warnings: list[Finding] = []
    notes: list[str] = []
    run, ids, outcome = facts.run, facts.ids, facts.outcome
    if run.error and not (outcome is not None and outcome.stage == "setter"):
        message = _no_apply_advice(_real_names(run.error, facts), facts.model)
        warnings.append(Finding("startup", f"SGLang will fail at start-up: the setter raises {message}"))
    if not run.takes_ids and ids is not None:
        warnings.append(
            Finding(
                "legacy",
                "this release's setter takes no ids: SGLang captures the default layers whatever the draft config says"
                " (`patchcraft apply` cannot change that: it patches only setters that take ids)",
            )
        )
    if ids is not None and run.takes_ids and not run.error:
        warnings += _range_warnings(facts)
    if facts.variant.endswith("heuristic") and ids is not None and run.layers_to_capture is not None:
        _heuristic_message(facts, warnings, notes)
    if outcome is not None:
        warnings += _run_findings(facts, outcome)
    elif facts.served.unknown:
        hint = _install_hint()
        warnings.append(
            Finding(
                "unknown",
                f"the static reading cannot tell what is served: {facts.served.unknown}; "
                f"install torch to run the code ({hint})",
            )
        )
    if ids is not None and -1 in ids and not facts.model.patched:
        warnings.append(_unpatched_embedding(facts))
        after_note = _after_apply_note(facts)
        if after_note:
            notes.append(after_note)
    _runner_message(facts, warnings, notes)
    if facts.model.plan.unsupported:
        notes.append(f"patchcraft cannot patch this model for -1: {facts.model.plan.unsupported}")
    notes.append(_source_note(facts))
    notes.append("assumes one pipeline stage (setters return early on all but the last one)")
    return warnings, notes


def _install_hint() -> str:
    from patchcraft.harness import INSTALL_HINT

    return INSTALL_HINT


def _run_findings(facts: _Facts, outcome: "RunOutcome") -> list[Finding]:
    """What running the code showed: a crash, nothing captured, an embedding that is no copy."""
    if outcome.crash:
        when = "at start-up: the setter raises" if outcome.stage == "setter" else "on its first forward:"
        kind = "startup" if outcome.stage == "setter" else "crash"
        return [Finding(kind, f"SGLang will crash {when} {_no_apply_advice(outcome.crash, facts.model)}")]
    if outcome.nothing:
        return [
            Finding(
                "nothing",
                "nothing is captured: the setter and forward ran and no hidden state reached the collector, "
                "so the draft is fed nothing (EAGLE-3 cannot run on these ids here)",
            )
        ]
    found = []
    if not outcome.all_copies:
        found.append(
            Finding(
                "embedding",
                "hs[0] reaches the collector as the embedding tensor itself, not a copy: "
                "layer 0's in-place residual add overwrites it before the draft reads it",
            )
        )
    unknown = [f.what for f in outcome.fed if f.state is None]
    if unknown:
        found.append(Finding("range", f"the collector got {unknown[0]}, which is no hidden state of the target"))
    return found


def _source_note(facts: _Facts) -> str:
    if facts.outcome is None:
        return "static reading: the served states are read from the code by rules (with torch, the code is run instead)"
    text = "served states from running this install's setter and forward on the CPU harness (stand-in layers, docs/harness.md)"
    if facts.states != facts.served.states and facts.ids is not None:
        static = facts.served.unknown and "unknown" or states_text(facts.served.states)
        text += f"; the static reading says {static}"
    return text


def _real_names(error: str, facts: _Facts) -> str:
    """A setter's message names ``type(self.model).__name__``: the static run's stand-in is no name to print."""
    if "StandIn" not in error:
        return error
    # ``self`` is the entry class (a delegate's setter runs on the delegate, the last call's owner).
    owner = facts.run.calls[-1].owner if len(facts.run.calls) > 1 else facts.model.cls
    inner = classes_assigned_to(facts.model.graph, owner, "model")
    return error.replace("StandIn", inner[0].name if inner else f"the inner model of {owner.name}")


def _no_apply_advice(error: str, model: Model) -> str:
    """A patched setter's own message says "run `patchcraft apply`"; where apply cannot help, say that instead."""
    if "patchcraft apply" not in error or apply_helps(model):
        return error
    cleaned = error.replace(" (run `patchcraft apply`)", "")
    return f"{cleaned}; `patchcraft apply` cannot help here ({model.patch_detail})"


def apply_helps(model: Model) -> bool:
    """Whether ``patchcraft apply`` would change this model (not unsupported, something to write)."""
    return not model.plan.unsupported and bool(model.patched_texts)


def _after_apply_note(facts: _Facts) -> str:
    if not apply_helps(facts.model):
        return ""
    ids = facts.ids
    if facts.outcome is not None:
        outcome = run_served(facts.model, ids, facts.num_layers, after_apply=True)
        if outcome is not None and outcome.ran and not outcome.crash and outcome.fed:
            return f"after `patchcraft apply`, these ids serve {states_text(outcome.states)} (run)"
        return ""
    after = serve(facts.model, ids, facts.num_layers, after_apply=True)
    if after.states and not after.run.error:
        return f"after `patchcraft apply`, these ids serve {states_text(after.states)}"
    return ""


def _range_warnings(facts: _Facts) -> list[Finding]:
    warnings = []
    reach, n = facts.served.reachable, facts.num_layers
    for row in facts.rows:
        if row.state is None and row.value not in reach:  # a crash there is the run's finding, not a range
            span = f"captures {min(reach)}..{max(reach)}" if reach else "captures nothing"
            warnings.append(
                Finding(
                    "range",
                    f"id {row.layer_id} is out of range: layers_to_capture {row.value} is never captured "
                    f"(this forward {span} for {n} layers), so the draft gets fewer states than ids",
                )
            )
    if not facts.rows:
        warnings += [
            Finding("range", f"id {i} is out of range for {n} layers") for i in facts.ids or () if i < -1 or i > n
        ]
    values = [v for v in facts.run.layers_to_capture or () if v in reach]
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        warnings.append(
            Finding(
                "range",
                f"several ids become layers_to_capture {', '.join(map(str, repeated))}: each layer is captured once, "
                "so the draft gets fewer states than ids",
            )
        )
    return warnings


def _heuristic_message(facts: _Facts, warnings: list[Finding], notes: list[str]) -> None:
    condition = f"`{facts.test}`" if facts.test else "a heuristic"
    kept = [i for i in facts.ids or () if not (facts.run.embedding and i == -1)]
    if facts.rule.startswith("ids kept raw") and kept:
        example = kept[0]
        warnings.append(
            Finding(
                "heuristic",
                f"heuristic {condition} keeps these ids raw: id {example} means {hs(example)}, not {hs(example + 1)} "
                "as under the +1 rule; the other ids in the list decide the meaning of every id",
            )
        )
    elif facts.rule.startswith("+1 rule") and facts.run.embedding:
        notes.append(
            f"-1 is given, so the other ids are layer outputs (+1) whatever heuristic {condition} would choose: "
            "patchcraft's setter gives one config one meaning on every release"
        )
    elif facts.rule.startswith("+1 rule"):
        notes.append(f"heuristic {condition} chose the +1 rule for these ids; another list could keep them raw")


def _unpatched_embedding(facts: _Facts) -> Finding:
    if 0 in (facts.run.layers_to_capture or ()):
        what = (
            "the setter turns it into layers_to_capture 0, a capture at the top of layer 0 where residual is None "
            "(some forwards crash there, others append an un-cloned embedding that layer 0 may overwrite in place)"
        )
    else:
        what = "no state is captured for it"
    if apply_helps(facts.model):
        fix = f"run `patchcraft apply` ({facts.model.patch_detail})"
    else:
        fix = f"`patchcraft apply` cannot help here ({facts.model.patch_detail})"
    return Finding("embedding", f"id -1 on an install not patched for -1: {what}; {fix}")


def _runner_message(facts: _Facts, warnings: list[Finding], notes: list[str]) -> None:
    if not facts.resets:
        return
    where = ", ".join(r.where for r in facts.resets)
    if facts.run.takes_ids and facts.ids is not None and facts.states != facts.default_states:
        warnings.append(
            Finding(
                "cuda-graph",
                f"CUDA-graph decode will capture the default layers ({states_text(facts.default_states)}), not these: "
                f"this release resets the ids before graph capture ({where}); "
                "run `patchcraft apply` (its runner edit passes the configured ids), or serve with --disable-cuda-graph",
            )
        )
    else:
        notes.append(f"this release resets the ids before CUDA-graph capture ({where})")


def fusion_defect(model: Model) -> str | None:
    """At TP > 1: the partial-sum warning when this model's capture reads a deferred all-reduce sum
    (found through the class graph, the same detection as the allreduce-fusion edit)."""
    from patchcraft.transforms import keep_captured_states_reduced as fusion

    return fusion.defect(model.tree.package, model.graph, model.cls)


# -- the inverse: ids that capture given states --------------------------------------


@dataclass(frozen=True)
class Suggestion:
    ids: tuple[int, ...]
    after_apply: bool


def suggest_ids(model: Model, wanted: Sequence[int], num_layers: int) -> Suggestion | None:
    """Config ids that make SGLang feed exactly ``wanted`` (HF indices), if any exist.

    Candidates for ``hs[e]`` are ``e - 1`` (the +1 rule; -1 for the
    embedding) and ``e`` (raw ids); each combination is run through the
    real setter. Without a patched install, the patched setter (in memory)
    answers, and the suggestion says ``patchcraft apply`` comes first.
    """
    wanted = tuple(wanted)
    if not wanted or list(wanted) != sorted(set(wanted)) or len(wanted) > 8:
        return None
    choices = [(e - 1, e) if e > 0 else (-1,) for e in wanted]
    for after_apply in (False, True):
        if after_apply and (model.patched or not model.patched_texts):
            break
        for candidate in itertools.product(*choices):
            served = serve(model, candidate, num_layers, after_apply=after_apply)
            if served.states == wanted and not served.run.error and not served.unsafe_embedding:
                return Suggestion(tuple(candidate), after_apply)
    return None
