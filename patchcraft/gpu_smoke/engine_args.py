"""``sglang.Engine`` keyword arguments for the smoke run, and a check of them
against a release's ``ServerArgs`` that never imports SGLang.

Up to ~0.5.18 ``ServerArgs`` is a dataclass in ``sglang/srt/server_args.py``.
From 0.5.20 it is assembled (``msgspec.defstruct``) from namespace classes
listed in ``_INPUT_NAMESPACES`` and declared in ``sglang/srt/arg_groups/fields``;
both layouts are parsed with :mod:`ast`.
"""

from __future__ import annotations

import ast
from typing import Any, Callable, Dict, List, Optional, Set

Reader = Callable[[str], Optional[str]]

SERVER_ARGS_PATH = "sglang/srt/server_args.py"

# Knob renamed in 0.5.14 (decode/prefill split); first one present wins.
CUDA_GRAPH_BS_KEYS = ("cuda_graph_max_bs", "cuda_graph_max_bs_decode")
# The prefill-side graph: "piecewise CUDA graph" up to 0.5.13, the "prefill
# CUDA graph" (breakable / tc_piecewise backends) from 0.5.14; first one present
# wins.  SGLang turns it off by itself for speculative runs only, so the
# baseline would prefill through other kernels than the speculative run: both
# engines get it off.
PREFILL_GRAPH_OFF_KEYS = ("disable_piecewise_cuda_graph", "disable_prefill_cuda_graph")
# At tp > 1 on Hopper/Blackwell, SGLang turns the FlashInfer allreduce (+
# add-norm) fusion on by itself for DeepSeek-style models.  patchcraft's edits
# do not cover that path yet, so the smoke run switches the fusion off where
# this field exists (0.5.10 on) and says so in its summary.
ALLREDUCE_FUSION_OFF_KEY = "enforce_disable_flashinfer_allreduce_fusion"
ENGINE_PATH = "sglang/srt/entrypoints/engine.py"
# What the baseline asks ``Engine.generate`` for: the top-2 logprobs of every
# output token, so near ties can be told from real divergences.
BASELINE_LOGPROB_KWARGS = {"return_logprob": True, "top_logprobs_num": 2}


def _module_to_paths(module: str) -> List[str]:
    base = module.replace(".", "/")
    return [base + ".py", base + "/__init__.py"]


def _class_fields(tree: ast.Module, name: str) -> Optional[Set[str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and not s.target.id.startswith("_")
                and "ClassVar" not in ast.unparse(s.annotation)
            }
    return None


def _namespace_names(tree: ast.Module) -> List[str]:
    """Names of the namespace classes ServerArgs collects its fields from."""
    lists: Dict[str, List[str]] = {}
    used: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)):
            names = [e.id for e in node.value.elts if isinstance(e, ast.Name)]
            for t in node.targets:
                if isinstance(t, ast.Name) and names:
                    lists[t.id] = names
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "collect_input_fields"
            and node.args
        ):
            arg = node.args[0]
            if isinstance(arg, ast.Name):
                used.append(arg.id)
            elif isinstance(arg, (ast.List, ast.Tuple)):
                lists["<inline>"] = [e.id for e in arg.elts if isinstance(e, ast.Name)]
                used.append("<inline>")
    out: List[str] = []
    for u in used:
        out += lists.get(u, [])
    return out


def server_args_fields(read: Reader) -> Set[str]:
    """Field names of ``ServerArgs`` in the release behind ``read``."""
    src = read(SERVER_ARGS_PATH)
    if src is None:
        raise FileNotFoundError(f"{SERVER_ARGS_PATH} not found in this sglang source")
    tree = ast.parse(src)
    fields = _class_fields(tree, "ServerArgs")
    if fields is None:
        raise ValueError("no class ServerArgs in server_args.py")
    imports: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                imports[a.asname or a.name] = node.module
    for ns in _namespace_names(tree):
        module = imports.get(ns)
        ns_fields = None
        for path in _module_to_paths(module) if module else []:
            ns_src = read(path)
            if ns_src is not None:
                ns_fields = _class_fields(ast.parse(ns_src), ns)
                if ns_fields is not None:
                    break
        if ns_fields is None:
            raise ValueError(f"ServerArgs namespace {ns} (from {module}) could not be parsed")
        fields |= ns_fields
    return fields


def speculative_algorithm_known(read: Reader, algorithm: str = "EAGLE3") -> bool:
    for rel in ("sglang/srt/speculative/spec_info.py", SERVER_ARGS_PATH, "sglang/srt/arg_groups/fields/spec.py"):
        src = read(rel)
        if src and algorithm in src:
            return True
    return False


def build_engine_kwargs(
    model_path: str,
    draft_path: Optional[str] = None,
    *,
    tp_size: int = 1,
    speculative: bool = True,
    num_steps: int = 3,
    eagle_topk: int = 1,
    num_draft_tokens: Optional[int] = None,
    mem_fraction_static: float = 0.3,
    cuda_graph_max_bs: int = 1,
    max_running_requests: int = 1,
    trust_remote_code: bool = False,
    random_seed: int = 0,
    log_level: str = "warning",
    fields: Optional[Set[str]] = None,
) -> Dict[str, Any]:
    """Keyword arguments for ``sglang.Engine(**kwargs)``.

    CUDA graphs stay enabled on purpose: the bug class the smoke run hunts
    (aux layers frozen into graphs captured before the draft's ids were set)
    only shows up on graph replay.  ``eagle_topk=1`` makes every verify batch a
    plain chain of tokens, so the reference is one causal forward.  ``fields``
    (from :func:`server_args_fields`) picks release-specific knob names and
    adds the switches that exist only in some releases: the prefill-side
    (piecewise) graph off for both engines, and at ``tp_size > 1`` the
    FlashInfer allreduce fusion off (:data:`ALLREDUCE_FUSION_OFF_KEY`).
    Without ``fields`` the 0.5.10 names are used.  Prompts run one at a time,
    so ``cuda_graph_max_bs = max_running_requests = 1``.
    """
    if tp_size < 1:
        raise ValueError("tp_size must be >= 1")
    kw: Dict[str, Any] = {
        "model_path": str(model_path),
        "tp_size": int(tp_size),
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "trust_remote_code": bool(trust_remote_code),
        "mem_fraction_static": float(mem_fraction_static),
        "disable_cuda_graph": False,
        "disable_radix_cache": True,  # every prompt is prefilled in full
        "max_running_requests": int(max_running_requests),
        "random_seed": int(random_seed),
        "log_level": log_level,
    }
    bs_key = CUDA_GRAPH_BS_KEYS[0]
    if fields is not None:
        bs_key = next((k for k in CUDA_GRAPH_BS_KEYS if k in fields), "")
    if bs_key:
        kw[bs_key] = int(cuda_graph_max_bs)
    pw_key = PREFILL_GRAPH_OFF_KEYS[0]
    if fields is not None:
        pw_key = next((k for k in PREFILL_GRAPH_OFF_KEYS if k in fields), "")
    if pw_key:
        kw[pw_key] = True
    if tp_size > 1 and (fields is None or ALLREDUCE_FUSION_OFF_KEY in fields):
        kw[ALLREDUCE_FUSION_OFF_KEY] = True
    if speculative:
        if not draft_path:
            raise ValueError("speculative run needs a draft_path")
        if num_draft_tokens is None:
            num_draft_tokens = num_steps + 1 if eagle_topk == 1 else num_steps * eagle_topk + 1
        kw.update(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=str(draft_path),
            speculative_num_steps=int(num_steps),
            speculative_eagle_topk=int(eagle_topk),
            speculative_num_draft_tokens=int(num_draft_tokens),
        )
    return kw


def greedy_sampling_params(max_new_tokens: int) -> Dict[str, Any]:
    return {"temperature": 0.0, "max_new_tokens": int(max_new_tokens), "ignore_eos": True}


def allreduce_fusion_note(kwargs: Dict[str, Any]) -> str:
    """One line for the summary: how the run treats the FlashInfer allreduce fusion."""
    if int(kwargs.get("tp_size", 1)) <= 1:
        return "not applicable (tp 1)"
    if kwargs.get(ALLREDUCE_FUSION_OFF_KEY):
        return f"disabled ({ALLREDUCE_FUSION_OFF_KEY}=True), not run patched"
    return f"release default: this release has no {ALLREDUCE_FUSION_OFF_KEY}, the fusion was not switched off"


def engine_generate_params(read: Reader) -> Optional[Set[str]]:
    """Parameter names of ``Engine.generate`` in the release behind ``read``
    (None when ``engine.py`` or the method cannot be found)."""
    src = read(ENGINE_PATH)
    if src is None:
        return None
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef) and node.name == "Engine":
            for fn in node.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == "generate":
                    a = fn.args
                    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} - {"self"}
    return None


def baseline_generate_kwargs(read: Reader) -> Dict[str, Any]:
    """``BASELINE_LOGPROB_KWARGS`` if this release's ``Engine.generate`` takes them, else ``{}``."""
    params = engine_generate_params(read)
    if params is None or not set(BASELINE_LOGPROB_KWARGS) <= params:
        return {}
    return dict(BASELINE_LOGPROB_KWARGS)


def check_engine_kwargs(kwargs: Dict[str, Any], read: Reader) -> List[str]:
    """Problems with ``kwargs`` for the release behind ``read`` (empty = ok)."""
    fields = server_args_fields(read)
    problems = [f"ServerArgs has no field {k!r}" for k in sorted(kwargs) if k not in fields]
    algo = kwargs.get("speculative_algorithm")
    if algo and not speculative_algorithm_known(read, algo):
        problems.append(f"speculative algorithm {algo!r} is unknown to this release")
    return problems
