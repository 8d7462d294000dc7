"""Which fused add-norm a vLLM release runs, and whether in place, per platform and compilation setting.

An EAGLE-3 entry that is the embedding tensor itself (``EagleModelMixin``'s
id 0 before ``apply``) keeps the embedding only while nothing writes into
it; layer 0 takes it as its residual, so it survives exactly when the
residual add-norm of the layers after it is *out of place*. That is the
platform's choice, not the model's, and it is read here from the release's
own code, never assumed:

- **IR era** (``RMSNorm.forward_native`` calls
  ``ir.ops.fused_add_rms_norm.maybe_inplace``, 0.27+): each platform's
  ``get_default_ir_op_priority`` (``platforms/<p>.py``, else
  ``platforms/interface.py``'s) is *run* on stand-ins for a compiled and an
  eager config (``--enforce-eager`` sets compilation mode NONE); the first
  provider of its ``fused_add_rms_norm`` list is what runs, in place when
  its ``register_impl(..., inplace=True)`` in ``kernels/`` says so
  (``native``, the op's own definition, is functional).
- **CustomOp era** (0.18-0.26): ``CustomOp.dispatch_forward`` runs the
  platform's ``forward_<p>`` when custom ops are on (``custom_ops`` "all",
  the default without Inductor: eager) and ``forward_native`` when off
  (compiled with Inductor); a method whose returned call reaches
  ``ops.fused_add_rms_norm`` (the C kernel, which writes into its inputs) is
  in place, one reaching ``forward_native``/``forward_static`` is not.

Where the code does not settle it, the setting says so (``in_place`` None)
with the reason. Nothing of vLLM is imported.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from patchcraft.reading.parsed import parse_python, statements
from patchcraft.base.sources import read_source

#: The platforms patchcraft reads, each with its file and the ``forward_*`` its CustomOp dispatch runs.
PLATFORMS: dict[str, tuple[str, str]] = {
    "cpu": ("platforms/cpu.py", "forward_cpu"),
    "cuda": ("platforms/cuda.py", "forward_cuda"),
    "rocm": ("platforms/rocm.py", "forward_hip"),
    "xpu": ("platforms/xpu.py", "forward_xpu"),
}
COMPILATIONS = ("eager", "compiled")
LAYERNORM = "model_executor/layers/layernorm.py"
#: CustomOp's defaults when a subclass does not define the platform's method (``custom_op.py``).
_FALLBACK = {"forward_hip": "forward_cuda", "forward_cpu": "forward_native", "forward_xpu": "forward_native"}


@dataclass(frozen=True)
class NormSetting:
    """One platform and compilation setting: the add-norm that runs, and whether it writes into the residual."""

    platform: str
    compilation: str  # "eager" (--enforce-eager) or "compiled" (vLLM's default)
    in_place: Optional[bool]  # None: the code does not settle it (``why`` says why)
    kernel: str
    why: str

    @property
    def label(self) -> str:
        return f"{self.platform} {self.compilation}"


def read_norm_dispatch(package: Path) -> tuple[NormSetting, ...]:
    """Every (platform, compilation) setting of the release at ``package``, in :data:`PLATFORMS` order."""
    layernorm = package / LAYERNORM
    if not layernorm.is_file():
        return tuple(_unread(p, c, f"{LAYERNORM} is not in this tree") for p in PLATFORMS for c in COMPILATIONS)
    module = parse_python(read_source(layernorm).text)
    rms = _class(module, "RMSNorm")
    if rms is None:
        return tuple(_unread(p, c, f"{LAYERNORM} defines no RMSNorm") for p in PLATFORMS for c in COMPILATIONS)
    native = _method(rms, "forward_native")
    if native is not None and ".maybe_inplace(" in ast.unparse(native):
        return tuple(_ir_setting(package, p, c) for p in PLATFORMS for c in COMPILATIONS)
    return tuple(_custom_op_setting(module, rms, p, c) for p in PLATFORMS for c in COMPILATIONS)


def setting_for(
    settings: tuple[NormSetting, ...], platform: Optional[str], compilation: Optional[str]
) -> tuple[NormSetting, ...]:
    """The settings a judgement covers: one platform (or all), one compilation (or both)."""
    return tuple(
        s
        for s in settings
        if (platform is None or s.platform == platform) and (compilation is None or s.compilation == compilation)
    )


def _unread(platform: str, compilation: str, why: str) -> NormSetting:
    return NormSetting(platform, compilation, None, "not read", why)


# --- the IR era ---------------------------------------------------------------------------------------


def _ir_setting(package: Path, platform: str, compilation: str) -> NormSetting:
    relative, _ = PLATFORMS[platform]
    function, where = _priority_function(package, relative)
    if function is None:
        return _unread(platform, compilation, where)
    try:
        priority = _run_priority(function, compilation)
    except Exception as exc:  # the release's code on stand-ins: what it needs that they lack is the reason
        return _unread(platform, compilation, f"{where} could not run on stand-ins ({type(exc).__name__}: {exc})")
    if not priority:
        return _unread(platform, compilation, f"{where} gives fused_add_rms_norm no provider")
    provider = priority[0]
    if provider == "native":
        return NormSetting(
            platform, compilation, False, "native", f"{where}: {priority}; native is functional (ir/ops/layernorm.py)"
        )
    flag = _provider_in_place(package, provider)
    if flag is None:
        return _unread(platform, compilation, f"{where}: {priority}; no register_impl of {provider!r} found")
    in_place, registered = flag
    words = "in place" if in_place else "out of place"
    return NormSetting(
        platform, compilation, in_place, provider, f"{where}: {priority}; {provider} {words} ({registered})"
    )


def _priority_function(package: Path, relative: str) -> tuple[Optional[ast.FunctionDef], str]:
    for path in (package / relative, package / "platforms" / "interface.py"):
        if not path.is_file():
            continue
        for node in statements(parse_python(read_source(path).text).body):
            if isinstance(node, ast.FunctionDef) and node.name == "get_default_ir_op_priority":
                return node, f"{path.relative_to(package)}:{node.lineno}"
    return None, f"no get_default_ir_op_priority in {relative} or platforms/interface.py"


class _Anything:
    """A stand-in that answers every attribute and call with itself, and is false."""

    def __getattr__(self, name: str) -> "_Anything":
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> "_Anything":
        return self

    def __bool__(self) -> bool:
        return False


class _CompilationMode:
    NONE, STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, VLLM_COMPILE = 0, 1, 2, 3


class _Priority:
    @staticmethod
    def with_default(default: list[str], **ops: list[str]) -> dict[str, list[str]]:
        return {"default": list(default), **{k: list(v) for k, v in ops.items()}}


class _Namespace:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        return _Anything()


def _run_priority(function: ast.FunctionDef, compilation: str) -> list[str]:
    """The release's ``get_default_ir_op_priority`` run on a config of ``compilation``: fused_add_rms_norm's list."""
    bare = ast.FunctionDef(
        name=function.name, args=function.args, body=function.body, decorator_list=[], returns=None, type_comment=None
    )
    source = textwrap.dedent(ast.unparse(ast.fix_missing_locations(ast.Module(body=[bare], type_ignores=[]))))
    modules = {
        "vllm.config.compilation": _Namespace(CompilationMode=_CompilationMode),
        "vllm.config.kernel": _Namespace(IrOpPriorityConfig=_Priority),
    }

    def importer(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        return modules.get(name, _Anything())

    builtins_ = dict(__builtins__) if isinstance(__builtins__, dict) else dict(vars(__builtins__))
    builtins_["__import__"] = importer
    namespace: dict[str, Any] = {"__builtins__": builtins_, "envs": _Anything(), "IrOpPriorityConfig": _Priority}
    exec(compile(source, "<get_default_ir_op_priority>", "exec"), namespace)  # noqa: S102 - the release's own code
    mode = _CompilationMode.VLLM_COMPILE if compilation == "compiled" else _CompilationMode.NONE
    config = _Namespace(compilation_config=_Namespace(backend="inductor", mode=mode), model_config=_Anything())
    result = namespace[function.name](_Anything(), config)
    if not isinstance(result, dict):
        raise TypeError(f"returned {type(result).__name__}")
    return list(result.get("fused_add_rms_norm") or result.get("default") or [])


def _provider_in_place(package: Path, provider: str) -> Optional[tuple[bool, str]]:
    kernels = package / "kernels"
    for path in sorted(kernels.rglob("*.py")) if kernels.is_dir() else ():
        for node in statements(parse_python(read_source(path).text).body):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in node.decorator_list:
                if not (
                    isinstance(decorator, ast.Call) and "fused_add_rms_norm.register_impl" in ast.unparse(decorator)
                ):
                    continue
                if not (decorator.args and isinstance(decorator.args[0], ast.Constant)):
                    continue
                if decorator.args[0].value != provider:
                    continue
                flag = next((k.value for k in decorator.keywords if k.arg == "inplace"), None)
                in_place = isinstance(flag, ast.Constant) and flag.value is True
                return in_place, f"{path.relative_to(package)}:{decorator.lineno}"
    return None


# --- the CustomOp era ---------------------------------------------------------------------------------


def _custom_op_setting(module: ast.Module, rms: ast.ClassDef, platform: str, compilation: str) -> NormSetting:
    _, method_name = PLATFORMS[platform]
    if compilation == "compiled":
        chosen, why = "forward_native", "custom ops off under Inductor (custom_ops 'none'): forward_native"
    else:
        chosen, why = method_name, f"custom ops on without Inductor (custom_ops 'all'): {method_name}"
    seen: list[str] = []
    while _method(rms, chosen) is None and chosen in _FALLBACK:
        seen.append(chosen)
        chosen = _FALLBACK[chosen]
    if seen:
        why += f" (RMSNorm has no {', '.join(seen)}: CustomOp's default is {chosen})"
    verdict = _method_in_place(module, rms, chosen, depth=0)
    if verdict is None:
        return _unread(platform, compilation, f"{why}; what RMSNorm.{chosen} returns is not read")
    in_place, evidence = verdict
    return NormSetting(platform, compilation, in_place, f"RMSNorm.{chosen}", f"{why}; {evidence}")


def _method_in_place(module: ast.Module, rms: ast.ClassDef, name: str, depth: int) -> Optional[tuple[bool, str]]:
    """Whether the call RMSNorm.``name`` finally returns writes into the residual, and the line that shows it."""
    method = _method(rms, name)
    if method is None or depth > 4:
        return None
    returned = _last_return_call(method)
    if returned is None:
        if name in ("forward_native", "forward_static") and _adds_out_of_place(method):
            return False, f"RMSNorm.{name} adds x + residual into a new tensor ({LAYERNORM}:{method.lineno})"
        return None
    callee = ast.unparse(returned.func)
    where = f"{LAYERNORM}:{returned.lineno}"
    if callee in ("self.forward_native", "self.forward_static", "self.forward_cuda", "self.forward_hip"):
        return _method_in_place(module, rms, callee.split(".")[1], depth + 1)
    if callee.endswith("ops.fused_add_rms_norm") or callee == "torch.ops._C.fused_add_rms_norm":
        return True, f"{where} calls {callee}, the C kernel that writes into its inputs"
    function = _function(module, callee)
    if function is not None:
        text = ast.unparse(function)
        if "ops.fused_add_rms_norm(" in text:
            return True, f"{where} calls {callee}, which calls ops.fused_add_rms_norm (in place)"
    if name in ("forward_native", "forward_static") and _adds_out_of_place(method):
        return False, f"RMSNorm.{name} adds x + residual into a new tensor ({LAYERNORM}:{method.lineno})"
    return None


def _adds_out_of_place(method: ast.FunctionDef) -> bool:
    text = ast.unparse(method)
    return "x + residual" in text and "residual.add_(" not in text and "copy_(" not in text


def _last_return_call(method: ast.FunctionDef) -> Optional[ast.Call]:
    """The call the method returns with a residual: one named for the fused add-norm, else its last top-level return."""
    returned = [n.value for n in ast.walk(method) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)]
    fused = [c for c in returned if ast.unparse(c.func).split(".")[-1] == "fused_add_rms_norm"]
    if fused:
        return fused[-1]
    for statement in reversed(method.body):
        if isinstance(statement, ast.Return):
            value = statement.value
            if isinstance(value, ast.Tuple) and value.elts:
                return None  # returns tensors it built itself: the body says how (forward_static)
            return value if isinstance(value, ast.Call) else None
    return None


def _class(module: ast.Module, name: str) -> Optional[ast.ClassDef]:
    return next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _method(cls: ast.ClassDef, name: str) -> Optional[ast.FunctionDef]:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _function(module: ast.Module, name: str) -> Optional[ast.FunctionDef]:
    return next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
