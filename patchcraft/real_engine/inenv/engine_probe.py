"""What the EAGLE-3 draft received, recorded in the engine's own process (stdlib + torch + the engine only).

Loaded as a vLLM *general plugin* (entry point group ``vllm.general_plugins``,
which vLLM loads in every process it starts: the offline engine, the
OpenAI server's engine-core process and its workers), so the record is taken
where the draft runs, not in the client. :func:`register` wraps
``combine_hidden_states`` of every EAGLE-3 draft class the release ships: the
one method that receives the target's aux hidden states, concatenated. Each
call's input is saved, once per shape of batch, under
``$PATCHCRAFT_PROBE_DIR/call-<pid>-<n>.pt``; nothing else is changed.
"""

# No ``from __future__ import annotations``: vLLM infers the in-place norm's op schema from real annotations.
import importlib
import itertools
import os
from typing import Optional

#: The targets' decoder layers: their outputs (``hidden_states + residual``, the pre-norm stream) are the
#: engine's own per-layer states, a second reference beside transformers' (recorded as each layer returns).
LAYER_CLASSES = (
    ("vllm.model_executor.models.llama", "LlamaDecoderLayer"),
    ("vllm.model_executor.models.qwen2", "Qwen2DecoderLayer"),
    ("vllm.model_executor.models.qwen3", "Qwen3DecoderLayer"),
    ("vllm.model_executor.models.qwen3_moe", "Qwen3MoeDecoderLayer"),
    ("vllm.model_executor.models.deepseek_v2", "DeepseekV2DecoderLayer"),
)
_layer_counter = itertools.count()
_MAX_LAYER_CALLS = 256
#: Draft modules of vLLM and their classes whose combine_hidden_states receives the aux states.
DRAFT_CLASSES = (
    ("vllm.model_executor.models.llama_eagle3", "Eagle3LlamaForCausalLM"),
    ("vllm.model_executor.models.deepseek_eagle3", "Eagle3DeepseekV2ForCausalLM"),
    ("vllm.model_executor.models.qwen3_eagle3", "Eagle3Qwen3ForCausalLM"),
    ("vllm.model_executor.models.llama4_eagle", "EagleLlama4ForCausalLM"),
)
_counter = itertools.count()
_MAX_CALLS = 64


def register() -> None:
    """vLLM calls this in each process; wrap the draft classes present in this release."""
    if os.environ.get("PATCHCRAFT_INPLACE_NORM") == "1":
        _register_inplace_norm()
    folder = os.environ.get("PATCHCRAFT_PROBE_DIR")
    if not folder:
        return
    for module_name, class_name in DRAFT_CLASSES:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # a draft module this release does not ship, or cannot import here
            continue
        cls = getattr(module, class_name, None)
        method = getattr(cls, "combine_hidden_states", None)
        if method is None or getattr(method, "_patchcraft_probe", False):
            continue
        setattr(cls, "combine_hidden_states", _wrapped(method, folder, f"{module_name}.{class_name}"))
    for module_name, class_name in LAYER_CLASSES:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            continue
        cls = getattr(module, class_name, None)
        forward = getattr(cls, "forward", None)
        if forward is None or getattr(forward, "_patchcraft_probe", False):
            continue
        setattr(cls, "forward", _layer_wrapped(cls, forward, folder))


def _layer_wrapped(cls, original, folder: str):
    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if type(self) is not cls or not (isinstance(out, tuple) and len(out) == 2):
            return out
        number = next(_layer_counter)
        if number < _MAX_LAYER_CALLS:
            import torch

            hidden, residual = out
            stream = hidden if residual is None else hidden + residual
            record = {"class": cls.__name__, "stream": stream.detach().float().cpu().clone()}
            path = os.path.join(folder, f"layer-{os.getpid()}-{number:04d}.pt")
            torch.save(record, path + ".tmp")
            os.replace(path + ".tmp", path)
        return out

    forward._patchcraft_probe = True  # type: ignore[attr-defined]
    return forward


def _model_files() -> dict:
    import sys

    return {
        name: getattr(module, "__file__", None)
        for name, module in sorted(sys.modules.items())
        if name.startswith("vllm.model_executor.models.") and module is not None
    }


def _wrapped(original, folder: str, where: str):
    def combine_hidden_states(self, hidden_states, *args, **kwargs):
        number = next(_counter)
        if number < _MAX_CALLS:
            import torch

            record = {
                "where": where,
                "shape": list(hidden_states.shape),
                "tensor": hidden_states.detach().float().cpu().clone(),
                # Which files this process runs the models from: the overlay's, or the install's.
                "model_files": _model_files() if number == 0 else {},
            }
            path = os.path.join(folder, f"call-{os.getpid()}-{number:03d}.pt")
            torch.save(record, path + ".tmp")
            os.replace(path + ".tmp", path)
        return original(self, hidden_states, *args, **kwargs)

    combine_hidden_states._patchcraft_probe = True  # type: ignore[attr-defined]
    return combine_hidden_states


def _register_inplace_norm() -> None:
    """``PATCHCRAFT_INPLACE_NORM=1``: an in-place fused add-norm on this platform (what ``vllm_c`` does on CUDA)."""
    import torch

    try:
        from vllm import ir
    except Exception:  # releases before vllm.ir dispatch through CustomOp instead
        return
    op = ir.ops.fused_add_rms_norm
    if "patchcraft_inplace" in op.impls:
        return
    native = op.impls["native"].impl_fn

    @op.register_impl("patchcraft_inplace", inplace=True)
    def fused_add_rms_norm(
        x: torch.Tensor,
        x_residual: torch.Tensor,
        weight: Optional[torch.Tensor],
        epsilon: float,
        variance_size: Optional[int] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        output, residual = native(x, x_residual, weight, epsilon, variance_size)
        x.copy_(output)
        x_residual.copy_(residual)
        return x, x_residual
