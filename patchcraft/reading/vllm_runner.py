"""Where a vLLM release takes the EAGLE-3 aux layer ids from, and which targets it admits, run from its code.

Three things decide what a vLLM server feeds a draft before any model code
runs, and all three change by release:

- **the runners.** The old runner (``v1/worker/gpu_model_runner.py``,
  ``GPUModelRunner._get_eagle3_aux_layers_from_config``) and the V2 runner
  (``v1/worker/gpu/``, ``get_eagle3_aux_layers_from_config`` in its
  ``spec_decode/eagle/eagle3_utils.py``) each read the draft's config
  their own way; with no ids (or none the function finds) the runner asks
  the model for its defaults (the getter it calls is read from its code).
  Releases before the function existed never read the draft's ids.
- **which runner is the default**: ``VLLM_USE_V2_MODEL_RUNNER``'s default
  in ``envs.py``, or the only runner the release ships.
- **the model-type gate** of ``SpeculativeConfig``: a list of names, one of
  which must be a substring of the target's ``model_type`` (none from the
  release that dropped it).

The id function is the release's own, compiled from its AST at its own
lines into a namespace with a few safe builtins and called on stand-ins for
the speculative config and the draft's ``hf_config`` (the draft's
``config.json`` fields as attributes, as vLLM's config classes give them).
Nothing of vLLM is imported; no torch.
"""

from __future__ import annotations

import ast
import builtins
import copy
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Sequence

from patchcraft.reading.parsed import parse_python, statements
from patchcraft.base.sources import read_source

V1_RUNNER = Path("v1") / "worker" / "gpu_model_runner.py"
V2_RUNNER = Path("v1") / "worker" / "gpu" / "model_runner.py"
V2_EAGLE3 = Path("v1") / "worker" / "gpu" / "spec_decode" / "eagle" / "eagle3_utils.py"
V1_FUNCTION = "_get_eagle3_aux_layers_from_config"
V2_FUNCTION = "get_eagle3_aux_layers_from_config"
ENV = "VLLM_USE_V2_MODEL_RUNNER"
GATE_FILES = (Path("config") / "speculative.py", Path("config") / "__init__.py", Path("config.py"))
_GETTER = re.compile(r"^get_eagle3_\w*aux_hidden_state_layers$")
_SAFE = (
    "abs all any bool dict enumerate getattr hasattr int isinstance len list max min range sorted str "
    "tuple set zip True False None AssertionError AttributeError KeyError TypeError ValueError"
).split()

#: Where a draft config can hold the ids: top level (speculators, vLLM's own) or SGLang's ``eagle_config``.
TOP_LEVEL = "top-level eagle_aux_hidden_state_layer_ids"
EAGLE_CONFIG = "eagle_config.eagle_aux_hidden_state_layer_ids"
#: The V2 runner's own key in ``eagle_config`` (0.34: ``drafter_config.get("layer_ids")``).
EAGLE_CONFIG_LAYER_IDS = "eagle_config.layer_ids"
PLACES = (TOP_LEVEL, EAGLE_CONFIG, EAGLE_CONFIG_LAYER_IDS)
#: The draft's whole ``config.json`` as it is (``read_runners(config=...)``): what the runner sets for it.
DRAFT_CONFIG = "the draft's config.json"


@dataclass(frozen=True)
class RunnerIds:
    """One runner of a release: whether it is the default, and what its own code makes of the draft's ids."""

    name: str  # "old runner v1/worker/gpu_model_runner.py"
    default: bool
    #: The release's id function, ``file:line``; "" when this runner never reads ids from the draft.
    function: str
    #: The model method the runner calls for the defaults (``get_eagle3_aux_hidden_state_layers``, ...).
    default_getter: str
    #: Per place in :data:`PLACES`: the ids the runner sets (a tuple), or None (it falls back to the defaults).
    resolved: tuple[tuple[str, Optional[tuple[int, ...]]], ...] = ()
    #: The function could not be run on the stand-ins: why ("" when it ran).
    error: str = ""

    def ids_for(self, place: str) -> Optional[tuple[int, ...]]:
        return dict(self.resolved).get(place)


@dataclass(frozen=True)
class Gate:
    """``SpeculativeConfig``'s model-type gate: names one of which must be in the target's ``model_type``."""

    names: Optional[tuple[str, ...]]  # None: this release has no gate
    where: str = ""  # file:line of the list

    def admits(self, model_type: str) -> bool:
        """The release's own rule: ``any(name in model_type for name in names)``."""
        return self.names is None or any(name in model_type for name in self.names)


# -- the runners ------------------------------------------------------------------------------


def read_runners(
    package: Path,
    layer_ids: Optional[Sequence[int]],
    config: Optional[Mapping[str, Any]] = None,
    platform: Optional[str] = None,
) -> tuple[RunnerIds, ...]:
    """Each runner the release ships, with the ids its own code sets for ``layer_ids`` in each place.

    ``config``: a draft's whole ``config.json``: what the runner sets for it is the place :data:`DRAFT_CONFIG`.
    ``platform``: on ``cpu`` (no Triton there) a release whose ``use_v2_model_runner`` falls back to the old
    runner without Triton (``if not HAS_TRITON``) defaults to the old runner.
    """
    v2_default = _v2_is_default(package) and not (platform == "cpu" and _v2_needs_triton(package))
    found = []
    if (package / V1_RUNNER).is_file():
        found.append(
            _runner(package, V1_RUNNER, V1_FUNCTION, "old runner", not v2_default, layer_ids, _v1_call, config)
        )
    eagle3 = V2_EAGLE3 if (package / V2_EAGLE3).is_file() else V2_RUNNER
    if (package / V2_RUNNER).is_file():
        default = v2_default or not (package / V1_RUNNER).is_file()
        found.append(_runner(package, eagle3, V2_FUNCTION, "V2 runner", default, layer_ids, _v2_call, config))
    return tuple(found)


def _v2_is_default(package: Path) -> bool:
    """``VLLM_USE_V2_MODEL_RUNNER``'s default in envs.py (``os.getenv(NAME, "0")``): True when it is "1";
    when it is None (0.33), ``VllmConfig.use_v2_model_runner`` decides: V2 when its last word is ``return True``
    (it falls back to the old runner only for features V2 lacks, or without Triton)."""
    path = package / "envs.py"
    if not path.is_file():
        return False
    default = _env_default(path)
    if default is None:
        return _config_prefers_v2(package / "config" / "vllm.py")
    return default


def _v2_needs_triton(package: Path) -> bool:
    """Whether ``VllmConfig.use_v2_model_runner`` falls back to the old runner without Triton (``not HAS_TRITON``)."""
    path = package / "config" / "vllm.py"
    if not path.is_file():
        return False
    for node in statements(parse_python(read_source(path).text).body):
        if isinstance(node, ast.FunctionDef) and node.name == "use_v2_model_runner":
            return any(isinstance(n, ast.If) and ast.unparse(n.test) == "not HAS_TRITON" for n in ast.walk(node))
    return False


def _config_prefers_v2(path: Path) -> bool:
    if not path.is_file():
        return False
    for node in statements(parse_python(read_source(path).text).body):
        if isinstance(node, ast.FunctionDef) and node.name == "use_v2_model_runner" and node.body:
            last = node.body[-1]
            return isinstance(last, ast.Return) and isinstance(last.value, ast.Constant) and last.value.value is True
    return False


def _env_default(path: Path) -> Optional[bool]:
    """The default of ``os.getenv(ENV, X)`` in envs.py: True for "1", False for "0" or no call, None for None."""
    for node in ast.walk(parse_python(read_source(path).text)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("getenv", "get")
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == ENV
            and isinstance(node.args[1], ast.Constant)
        ):
            value = node.args[1].value
            return None if value is None else str(value).strip() in ("1", "True", "true")
    return False


def _runner(
    package: Path,
    relative: Path,
    function: str,
    label: str,
    default: bool,
    layer_ids: Optional[Sequence[int]],
    call: Callable[[Callable[..., Any], Any], Any],
    config: Optional[Mapping[str, Any]] = None,
) -> RunnerIds:
    runner_file = V1_RUNNER if label == "old runner" else V2_RUNNER
    name = f"{label} {runner_file.as_posix()}"
    path = package / relative
    tree = ast.parse(read_source(path).text, filename=str(path))
    getters = _getters(tree) or _getters(parse_python(read_source(package / runner_file).text))
    getter = getters[0] if getters else ""
    node = _function(tree, function)
    if node is None:
        return RunnerIds(name, default, "", getter)
    where = f"{relative.as_posix()}:{node.lineno}"
    try:
        compiled = _compile(node, path)
        resolved = tuple((place, _ids(call(compiled, _spec_config(place, layer_ids)))) for place in PLACES)
        if config is not None:
            resolved += ((DRAFT_CONFIG, _ids(call(compiled, _draft_spec(config)))),)
    except Exception as exc:  # the release's function needs more than the stand-ins give
        return RunnerIds(name, default, where, getter, error=f"{type(exc).__name__}: {exc}")
    return RunnerIds(name, default, where, getter, resolved)


def _getters(tree: ast.Module) -> list[str]:
    """The model's default-id getters the code calls (``self.model.get_eagle3_..._layers()``), in order."""
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and _GETTER.match(n.func.attr)
    ]
    return [c.func.attr for c in sorted(calls, key=lambda c: c.lineno)]  # type: ignore[attr-defined]


def _function(tree: ast.Module, name: str) -> Optional[ast.FunctionDef]:
    found = [n for n in statements(tree.body) if isinstance(n, ast.FunctionDef) and n.name == name]
    return found[0] if found else None


def _compile(node: ast.FunctionDef, path: Path) -> Callable[..., Any]:
    """The function from its own AST (annotations and decorators dropped), its lines kept."""
    func = copy.deepcopy(node)
    func.decorator_list, func.returns = [], None
    args = func.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    namespace: dict[str, Any] = {
        "__builtins__": {name: getattr(builtins, name) for name in _SAFE},
        "logger": SimpleNamespace(info=_quiet, debug=_quiet, warning=_quiet, info_once=_quiet, warning_once=_quiet),
    }
    module = ast.Module(body=[func], type_ignores=[])
    exec(compile(module, str(path), "exec", dont_inherit=True), namespace)  # noqa: S102 - the release's own code
    return namespace[node.name]  # type: ignore[no-any-return]


def _quiet(*args: Any, **kwargs: Any) -> None:
    return None


def _spec_config(place: str, layer_ids: Optional[Sequence[int]]) -> Any:
    """A speculative config whose draft's ``hf_config`` holds ``layer_ids`` at ``place`` (nothing when None)."""
    fields: dict[str, Any] = {}
    if layer_ids is not None:
        if place == TOP_LEVEL:
            fields["eagle_aux_hidden_state_layer_ids"] = list(layer_ids)
        else:
            fields["eagle_config"] = {place.rpartition(".")[2]: list(layer_ids)}
    return SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**fields)))


def _draft_spec(config: Mapping[str, Any]) -> Any:
    """A speculative config whose draft's ``hf_config`` has the fields of ``config`` (objects stay dicts)."""
    fields = {str(key): copy.deepcopy(value) for key, value in config.items()}
    return SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**fields)))


def _v1_call(function: Callable[..., Any], spec_config: Any) -> Any:
    return function(SimpleNamespace(speculative_config=spec_config))


def _v2_call(function: Callable[..., Any], spec_config: Any) -> Any:
    return function(spec_config)


def _ids(value: Any) -> Optional[tuple[int, ...]]:
    return tuple(int(v) for v in value) if value else None


# -- the model-type gate ------------------------------------------------------------------------


def read_gate(package: Path) -> Gate:
    """The release's model-type gate for EAGLE-3 targets (its list and line), or no gate."""
    for relative in GATE_FILES:
        path = package / relative
        if not path.is_file():
            continue
        tree = parse_python(read_source(path).text)
        for node in statements(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                gate = _gate_in(node, relative)
                if gate is not None:
                    return gate
    return Gate(None)


def _gate_in(func: ast.AST, relative: Path) -> Optional[Gate]:
    """In a test of ``func`` that names "eagle3": ``any(x in ....model_type for x in LIST)`` over a list of
    strings ``func`` assigns, or ``"name" not in ....model_type`` (0.9)."""
    lists = {
        t.id: n
        for n in ast.walk(func)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.List)
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.value.elts)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    tests = [n.test for n in ast.walk(func) if isinstance(n, ast.If) and _mentions_eagle3(n.test)]
    for node in (n for test in tests for n in ast.walk(test)):
        if _single_name_gate(node):  # 0.9: `"llama" not in ....model_type`
            return Gate((node.left.value,), f"{relative.as_posix()}:{node.lineno}")  # type: ignore[attr-defined]
        if not (isinstance(node, ast.GeneratorExp) and isinstance(node.elt, ast.Compare)):
            continue
        compare = node.elt
        right = compare.comparators[0] if compare.comparators else None
        if not (isinstance(compare.ops[0], ast.In) and isinstance(right, ast.Attribute) and right.attr == "model_type"):
            continue
        source = node.generators[0].iter
        if isinstance(source, ast.Name) and source.id in lists:
            assign = lists[source.id]
            names = tuple(e.value for e in assign.value.elts)  # type: ignore[attr-defined]
            return Gate(names, f"{relative.as_posix()}:{assign.lineno}")
    return None


def _single_name_gate(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.left.value, str)
        and isinstance(node.ops[0], ast.NotIn)
        and isinstance(node.comparators[0], ast.Attribute)
        and node.comparators[0].attr == "model_type"
    )


def _mentions_eagle3(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Constant) and n.value == "eagle3" for n in ast.walk(test))


# -- the model registry ------------------------------------------------------------------------

REGISTRY = Path("model_executor") / "models" / "registry.py"
#: The registry's table of generating models: the architectures a server can be given as its target.
GENERATION_TABLE = "_TEXT_GENERATION_MODELS"


def read_registry(package: Path) -> dict[str, tuple[str, str]]:
    """vLLM's ``{architecture: (model file stem, class)}`` for text generation (``{}`` when there is none).

    A config's ``architectures`` names one of these keys; several keys name one class
    (``MistralForCausalLM`` is ``llama.LlamaForCausalLM`` on 0.9, ``mistral.MistralForCausalLM`` later).
    """
    path = package / REGISTRY
    if not path.is_file():
        return {}
    for node in parse_python(read_source(path).text).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == GENERATION_TABLE for t in targets) and isinstance(value, ast.Dict):
            return dict(_entries(value))
    return {}


def _entries(table: ast.Dict) -> list[tuple[str, tuple[str, str]]]:
    found = []
    for key, value in zip(table.keys, table.values):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Tuple)):
            continue
        parts = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(parts) >= 2:
            found.append((key.value, (parts[0], parts[1])))
    return found
