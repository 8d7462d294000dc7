"""What SGLang's CPU engine needs in each of its processes, installed at run time (the install is never written).

:func:`install` runs in the engine driver and again in every process SGLang
spawns (the scheduler imports the driver script as ``__mp_main__``, which
calls it at module level): the CPU switches, the torchvision placeholder,
patchcraft's ``sgl_kernel`` stand-ins, the aux-state probe at
``ModelRunner.forward``, the error record, and the torch-native fixes, each
applied only where the release has the gap (read from its code at run time)
and each named in the notes it returns.

Stdlib, torch and sglang only, plus the files beside it and patchcraft's own
standalone ``gpu_smoke/probe.py``, loaded by path.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
#: patchcraft's own gpu_smoke folder (standalone modules: torch + stdlib), beside real_engine/.
GPU_SMOKE = HERE.parent.parent / "gpu_smoke"

ENV_ERROR_FILE = "PATCHCRAFT_SGLANG_ERROR_FILE"
ENV_NOTES_FILE = "PATCHCRAFT_SGLANG_NOTES_FILE"
ENV_TREE = "PATCHCRAFT_SGLANG_TREE_KERNELS"
ENV_PROBE = "PATCHCRAFT_SMOKE_PROBE_DIR"  # gpu_smoke/probe.py's

_done: dict[str, Any] = {}


def load_standalone(name: str) -> types.ModuleType:
    """patchcraft's standalone ``gpu_smoke/<name>.py``, loaded by path (patchcraft is not installed here)."""
    key = f"patchcraft_gpu_smoke_{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = GPU_SMOKE / f"{name}.py"
    spec = importlib.util.spec_from_file_location(key, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot load patchcraft's {name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def where(obj: Any) -> str:
    """``sglang/...py:LINE`` of a function or class, relative to site-packages."""
    try:
        path = Path(inspect.getsourcefile(obj) or "?")
        line = inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return "?"
    parts = path.parts
    rel = "/".join(parts[parts.index("sglang") :]) if "sglang" in parts else str(path)
    return f"{rel}:{line}"


def sglang_frames(tb: Any) -> list[tuple[str, int]]:
    """(``sglang/...py``, line) of each traceback frame inside the sglang package, outermost first."""
    found: list[tuple[str, int]] = []
    for frame in traceback.extract_tb(tb):
        parts = Path(frame.filename).parts
        if "sglang" in parts:
            index = len(parts) - 1 - parts[::-1].index("sglang")
            found.append(("/".join(parts[index:]), int(frame.lineno or 0)))
    return found


def error_record(exc: BaseException) -> dict[str, Any]:
    frames = sglang_frames(exc.__traceback__)
    file, line = frames[-1] if frames else (None, None)
    models = [f"{f}:{n}" for f, n in frames if f.startswith("sglang/srt/models/")]
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "file": file,
        "line": line,
        "where": "last frame inside the sglang package" if file else "no frame inside the sglang package",
        "model_frame": models[-1] if models else None,
        "sglang_frames": [f"{f}:{n}" for f, n in frames[-6:]],
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-6000:],
    }


def write_error(exc: BaseException) -> None:
    path = os.environ.get(ENV_ERROR_FILE)
    if not path:
        return
    record = error_record(exc)
    record["pid"] = os.getpid()
    try:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
    except OSError:
        pass


def _note(notes: list[str], text: str) -> None:
    notes.append(text)
    path = os.environ.get(ENV_NOTES_FILE)
    if path and os.environ.get("PATCHCRAFT_SGLANG_ROLE") == "driver":
        try:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(text) + "\n")
        except OSError:
            pass


def install() -> dict[str, Any]:
    """Everything, once per process; returns {"kernels": ..., "notes": [...]}."""
    if _done:
        return _done
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    notes: list[str] = []
    import sglang_standins
    from sglang_standins import absent

    for root in absent.install(("torchvision",)):
        _note(
            notes,
            f"{root}: a placeholder package (the registry's build does not load against torch +cpu); any call raises",
        )
    kernels = sglang_standins.install(os.environ.get(ENV_TREE, "torch"))
    _hook_errors(notes)
    _fix_draft_extend_map(notes)
    _fix_torch_native(notes)
    _fix_cuda_sync(notes)
    _install_probe()
    _done.update({"kernels": kernels, "notes": notes})
    return _done


def _hook_errors(notes: list[str]) -> None:
    """The scheduler logs its exception with ``get_exception_traceback()`` and signals the
    driver; wrap that function (before the scheduler module binds it) to write the
    exception, with its last frame inside sglang, to the error file."""
    import sglang.utils as sglang_utils

    original = sglang_utils.get_exception_traceback

    def get_exception_traceback() -> str:
        exc = sys.exc_info()[1]
        if exc is not None:
            write_error(exc)
        return str(original())

    sglang_utils.get_exception_traceback = get_exception_traceback


def _fix_draft_extend_map(notes: list[str]) -> None:
    """EAGLE's draft-extend backend map has no ``torch_native``: give the factory one,
    built as the target's torch-native backend is."""
    try:
        from sglang.srt.speculative import draft_utils
    except ImportError:
        return
    factory = getattr(draft_utils, "DraftBackendFactory", None)
    method = getattr(factory, "create_draft_extend_backend", None)
    if factory is None or method is None:
        return
    source = inspect.getsource(method)
    if "torch_native" in source:
        return
    original_create = factory._create_backend
    # 0.5.2x's creators return (stamp, backend); earlier ones the backend alone: read which from the code.
    stamped = "stamp, backend = backend_map" in inspect.getsource(original_create)

    def _create_backend(self: Any, backend_name: str, backend_map: dict, error_template: str, **kw: Any) -> Any:
        if "torch_native" not in backend_map:
            from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

            def create() -> Any:
                backend = TorchNativeAttnBackend(self.draft_model_runner)
                return ("torch_native", backend) if stamped else backend

            backend_map = dict(backend_map)
            backend_map["torch_native"] = create
        return original_create(self, backend_name, backend_map, error_template, **kw)

    factory._create_backend = _create_backend
    _note(
        notes,
        f"fix: EAGLE's draft backend maps have no torch_native ({where(method)}): "
        "DraftBackendFactory._create_backend given a TorchNativeAttnBackend entry",
    )


def _fix_torch_native(notes: list[str]) -> None:
    """Two gaps of ``TorchNativeAttnBackend.forward_extend`` on EAGLE's paths.

    TARGET_VERIFY (and a draft extend that comes without them) leaves
    ``extend_prefix_lens``/``extend_seq_lens`` unset while ``seq_lens`` holds the
    committed length: the verify tokens are an extend of ``n`` tokens per request
    after that prefix (a chain at topk 1, so causal attention is exact).

    DeepSeek MLA takes the MHA path for a prefill: ``k``/``v`` come per head, but
    the backend reads K and V back from the latent KV cache (one head of
    ``kv_lora_rank + rope`` dims): run that prefill on the ``k``/``v`` it was
    given instead (no prefix: causal attention over the request's own tokens).
    """
    try:
        from sglang.srt.layers.attention import torch_native_backend as tnb
    except ImportError:
        return
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    backend = tnb.TorchNativeAttnBackend
    original = backend.forward_extend
    site = where(original)
    run_extend = where(backend._run_sdpa_forward_extend)

    def forward_extend(self: Any, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, save_kv_cache: bool = True):
        mode = forward_batch.forward_mode
        saved = None
        if forward_batch.extend_prefix_lens is None or forward_batch.extend_seq_lens is None:
            bs = int(forward_batch.seq_lens.shape[0])
            per_req = q.shape[0] // max(bs, 1)
            lens = torch.full((bs,), per_req, dtype=forward_batch.seq_lens.dtype, device=q.device)
            saved = (forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens, forward_batch.seq_lens)
            if mode.is_target_verify() or forward_batch.extend_prefix_lens is None:
                forward_batch.extend_prefix_lens = forward_batch.seq_lens
                forward_batch.seq_lens = forward_batch.seq_lens + lens
            forward_batch.extend_seq_lens = lens
            _FIRED.add("verify-lens")
        try:
            if k is not None and _mha_over_latent(self, layer, k, forward_batch):
                _FIRED.add("mla-mha")
                return _mha_prefill(self, q, k, v, layer, forward_batch, save_kv_cache, scaled_dot_product_attention)
            return original(self, q, k, v, layer, forward_batch, save_kv_cache)
        finally:
            if saved is not None:
                forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens, forward_batch.seq_lens = saved

    backend.forward_extend = forward_extend
    _note(
        notes,
        f"fix: TARGET_VERIFY leaves extend_prefix_lens/extend_seq_lens unset for {site} ({run_extend} "
        "asserts on them): set to the committed seq_lens and the verify width, seq_lens widened by it",
    )
    _note(
        notes,
        f"fix: DeepSeek MLA's MHA prefill under torch_native reads K/V from the latent cache ({site}): "
        "attention over the k/v the layer passed (no prefix) instead",
    )


#: Which runtime fixes actually ran in this process (the driver reports the scheduler's through notes).
_FIRED: set[str] = set()


def _mha_over_latent(self: Any, layer: Any, k: Any, forward_batch: Any) -> bool:
    """True when the layer passes per-head K but the pool holds MLA latents of another width."""
    pool = getattr(self, "token_to_kv_pool", None) or getattr(forward_batch, "token_to_kv_pool", None)
    try:
        cache = pool.get_key_buffer(layer.layer_id)  # type: ignore[union-attr]
    except Exception:
        return False
    k_heads = k.reshape(k.shape[0], -1, layer.qk_head_dim)
    return bool(cache.shape[-1] != layer.qk_head_dim or cache.shape[-2] != k_heads.shape[1])


def _mha_prefill(
    self: Any, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, save_kv_cache: bool, sdpa: Any
) -> Any:
    if save_kv_cache:
        raise RuntimeError("patchcraft torch_native MLA fix: MHA prefill asked to save per-head K into a latent cache")
    prefix = forward_batch.extend_prefix_lens
    if prefix is not None and int(prefix.max()) > 0:
        raise RuntimeError("patchcraft torch_native MLA fix: an MHA prefill over a cached prefix is not stood in")
    heads = layer.tp_q_head_num
    q_ = q.reshape(-1, heads, layer.qk_head_dim)
    k_ = k.reshape(-1, layer.tp_k_head_num, layer.qk_head_dim)
    v_ = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)
    out = q.new_empty((q_.shape[0], heads, layer.v_head_dim))
    start = 0
    for length in [int(x) for x in forward_batch.extend_seq_lens.tolist()]:
        end = start + length
        attn = sdpa(
            q_[start:end].transpose(0, 1).unsqueeze(0),
            k_[start:end].transpose(0, 1).unsqueeze(0),
            v_[start:end].transpose(0, 1).unsqueeze(0),
            is_causal=True,
            scale=layer.scaling,
            enable_gqa=heads != layer.tp_k_head_num,
        )
        out[start:end] = attn.squeeze(0).transpose(0, 1)
        start = end
    return out.reshape(q_.shape[0], heads * layer.v_head_dim)


def _fix_cuda_sync(notes: list[str]) -> None:
    """Releases up to 0.5.10 call ``torch.cuda.synchronize()`` unguarded when the EAGLE worker hands the
    draft the target's embedding (``LlamaForCausalLM.set_embed``, ``models/llama.py:778`` on 0.5.10): on a
    CPU torch that is ``AssertionError: Torch not compiled with CUDA enabled``. With no CUDA there is
    nothing to wait for: a no-op, only where the release's set_embed makes the call."""
    import torch

    if torch.cuda.is_available():
        return
    import ast

    spec = importlib.util.find_spec("sglang.srt.models.llama")  # read, not imported: no import-order effects
    if spec is None or not spec.origin:
        return
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "set_embed":
            if "torch.cuda.synchronize" in ast.unparse(node):
                torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
                _note(
                    notes,
                    f"fix: sglang/srt/models/llama.py:{node.lineno} (set_embed) calls torch.cuda.synchronize() "
                    "on a CPU torch: a no-op",
                )
            return


def _install_probe() -> None:
    if not os.environ.get(ENV_PROBE):
        return
    probe = load_standalone("probe")
    from sglang.srt.model_executor.model_runner import ModelRunner

    probe.install(ModelRunner)
