"""The DeepSeek-V4 case of the vLLM CPU run: its tiny target, its draft, and the engine's own states.

Runs inside the engine environment (stdlib + torch; vLLM imported only in
:func:`install_recorders` and :func:`widen_dummy_init`). transformers has no
DeepSeek-V4, so the target is a config only (``load_format="dummy"``: vLLM's
own loader fills the weights, its range widened to U(-0.05, 0.05) so each
layer's output differs from the next), and the reference the draft's input is
matched against is the engine's own: the embedding output and each decoder
layer's output, reduced as the EAGLE-3 capture reduces them
(``.mean(dim=1)`` over the ``hc_mult`` streams), recorded in the process that
runs the model (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:
    from tiny_models import YARN_FACTOR_1  # in the engine's environment: inenv/ is on sys.path
except ModuleNotFoundError:  # imported as patchcraft.real_engine.inenv.vllm_dsv4 (the unit tests)
    from .tiny_models import YARN_FACTOR_1

HIDDEN = 256
DUMMY_RANGE = 0.05
#: ``model_executor/models/`` is not where DeepSeek-V4 lives: the modules a patched run must serve from the overlay.
MODULE_PREFIXES = ("vllm.model_executor.models.", "vllm.models.deepseek_v4.")


def target_config(num_layers: int) -> dict[str, Any]:
    """A tiny DeepSeek-V4: sizes the CPU path asserts (head_dim 512, rope 64), every layer sliding-window only
    (compress_ratios 0: no compressor or indexer), 4 hc streams, a small MoE with one hash-routed layer."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "torch_dtype": "bfloat16",
        "vocab_size": 512,
        "hidden_size": HIDDEN,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 64,
        "o_lora_rank": 64,
        "o_groups": 2,
        "sliding_window": 64,
        "compress_ratios": [0] * num_layers,
        "index_topk": 16,
        "index_n_heads": 4,
        "index_head_dim": 128,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "n_shared_experts": 1,
        "num_hash_layers": 1,
        "swiglu_limit": 10.0,
        "norm_topk_prob": True,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "routed_scaling_factor": 1.5,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 4,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": dict(YARN_FACTOR_1),
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


def build_target(num_layers: int, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(target_config(num_layers), indent=1), encoding="utf-8")
    return folder


def build_draft(target: dict[str, Any], layer_ids: list[int], folder: Path, seed: int) -> Path:
    """A random Llama EAGLE-3 head of the target's width in bf16, one KV head (its cache pages then fit beside
    the target's fp8_ds_mla ones)."""
    import tiny_models

    config = tiny_models.draft_config(target, layer_ids)
    hidden = target["hidden_size"]
    config.update(hidden_size=hidden, target_hidden_size=hidden, num_key_value_heads=1, torch_dtype="bfloat16")
    tensors = tiny_models.draft_tensors(len(layer_ids), target["vocab_size"], seed, hidden=hidden, kv_heads=1)
    return tiny_models.save_draft(folder, config, tensors)


def engine_kwargs(num_layers: int) -> dict[str, Any]:
    """What this case changes in ``vllm.LLM(...)``: bf16 (the fp8_ds_mla cache), dummy weights, the draft's layer
    (index ``num_layers``) out of the fp8 cache."""
    return {"dtype": "bfloat16", "load_format": "dummy", "kv_cache_dtype_skip_layers": [str(num_layers)]}


def widen_dummy_init(bound: float = DUMMY_RANGE) -> None:
    """vLLM's dummy loader draws U(-1e-3, 1e-3): so small that the layers' outputs barely differ. U(-bound, bound)."""
    from vllm.model_executor.model_loader import dummy_loader

    original = dummy_loader.initialize_single_dummy_weight

    def initialize(param: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.update(low=-bound, high=bound)
        original(param, **kwargs)

    dummy_loader.initialize_single_dummy_weight = initialize


#: The forwards of DeepseekV4Model this process ran: each {"embed", "layers", "aux_ptrs", "embed_ptr"}.
RECORDS: list[dict[str, Any]] = []
_MAX_FORWARDS = 16


def install_recorders() -> None:
    """Wrap DeepseekV4Model's forward and embedding and its decoder layers' forward (the CPU module, the one the
    CPU platform serves, from the install or the overlay, whichever this process imports)."""
    from vllm.models.deepseek_v4.cpu import model

    Model, Layer = model.DeepseekV4Model, model.DeepseekV4DecoderLayer
    forward, embed, layer_forward = Model.forward, Model.embed_input_ids, Layer.forward
    current: list[dict[str, Any]] = []

    def model_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        record: dict[str, Any] = {"embed": None, "layers": [], "aux_ptrs": [], "embed_ptr": None}
        current.append(record)
        try:
            out = forward(self, *args, **kwargs)
        finally:
            current.pop()
        if isinstance(out, tuple) and len(out) == 2:
            record["aux_ptrs"] = [t.untyped_storage().data_ptr() for t in out[1]]
        if len(RECORDS) < _MAX_FORWARDS and record["embed"] is not None:
            RECORDS.append(record)
        return out

    def embed_input_ids(self: Any, input_ids: Any) -> Any:
        out = embed(self, input_ids)
        if current and current[-1]["embed"] is None:
            current[-1]["embed"] = out.detach().float().cpu().clone()
            current[-1]["embed_ptr"] = out.untyped_storage().data_ptr()
        return out

    def decoder_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = layer_forward(self, *args, **kwargs)
        if current:
            stream = self.hc_post(*out) if self.use_fused_mhc else out[0]  # as the capture reads it
            current[-1]["layers"].append(stream.detach().mean(dim=1).float().cpu().clone())
        return out

    Model.forward, Model.embed_input_ids, Layer.forward = model_forward, embed_input_ids, decoder_forward


def save_records(path: Path) -> None:
    import torch

    torch.save(RECORDS, path)


def engine_states(
    records: list[dict[str, Any]], rows: int, total: int, num_layers: int
) -> tuple[list[Any], dict[str, Any]]:
    """``[hs[0], ..., hs[L]]`` of the first forward that holds the whole first prompt (``rows`` to ``total`` rows:
    its prefill), and what that forward says of id 0's entry (a new tensor, or the embedding's own storage).
    ([], {}) when no recorded forward has every layer."""
    for record in records:
        embed, layers = record["embed"], record["layers"]
        if embed is not None and rows <= embed.shape[0] <= total and len(layers) == num_layers:
            aux = record.get("aux_ptrs") or []
            shares = bool(aux) and record.get("embed_ptr") in aux
            return [embed, *layers], {"aux_entries": len(aux), "an_entry_shares_the_embedding": shares}
    return [], {}


def check_distinct(states: list[Any], rows: int) -> list[str]:
    """Problems that would make a match meaningless: two states equal (or nearly) on the prompt's rows."""
    problems = []
    for k in range(len(states) - 1):
        a, b = states[k][:rows].float(), states[k + 1][:rows].float()
        gap = float((a - b).abs().max()) / (float(b.abs().max()) or 1.0)
        if gap < 1e-2:
            problems.append(f"hs[{k}] and hs[{k + 1}] differ by {gap:.2g} (relative): too close to tell apart")
    return problems
