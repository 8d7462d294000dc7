"""Tiny random DeepSeek-V3 target checkpoint and its Hugging Face reference.

The checkpoint uses the original DeepSeek-V3 tensor names (one tensor per
expert: ``mlp.experts.{e}.gate_proj.weight`` ...), which is what SGLang's
``deepseek_v2.py`` loader reads.  Weights come from a per-tensor seeded
generator, so the files are identical whatever ``transformers`` version is
installed.  The Hugging Face ``DeepseekV3ForCausalLM`` class is used for the
reference forward; :func:`load_hf_reference_model` loads the files into it
with ``strict=True`` (transformers 5 packs experts into 3-D tensors; both
layouts are handled).

Nothing is downloaded and no tokenizer is needed: prompts are token ids.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

PathLike = Union[str, Path]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
META_NAME = "patchcraft_smoke.json"

# Kinds drive the initialisation of each tensor.
_STD = {"linear": 0.02, "embed": 0.02, "router": 0.02, "lm_head": 0.2}


def tiny_deepseek_v3_config(
    *,
    tp_size: int = 1,
    num_layers: int = 4,
    first_k_dense_replace: int = 1,
    hidden_size: int = 512,
    vocab_size: int = 1024,
    num_attention_heads: Optional[int] = None,
    n_routed_experts: int = 8,
    num_experts_per_tok: int = 2,
    n_shared_experts: int = 1,
    intermediate_size: int = 1024,
    moe_intermediate_size: int = 512,
    kv_lora_rank: int = 512,
    q_lora_rank: Optional[int] = 256,
    qk_nope_head_dim: int = 128,
    qk_rope_head_dim: int = 64,
    v_head_dim: int = 128,
    max_position_embeddings: int = 2048,
) -> Dict[str, Any]:
    """An original-style DeepSeek-V3 ``config.json`` dict, sized for a smoke run.

    Defaults keep the MLA geometry of the real model (kv_lora_rank 512, rope
    dim 64, 192/128 head dims) because SGLang's MLA kernels are built for it;
    widths are divisible by every tp up to 8.  ``num_attention_heads``
    defaults to ``16 * tp_size``: 16 heads per rank, as DeepSeek-V3 (128
    heads) has at tp 8, so the MLA kernels see a per-rank shape they are
    used with.  Routing is Kimi-K2 style
    (``n_group = topk_group = 1``) with DeepSeek-V3's sigmoid + ``noaux_tc``.
    """
    if tp_size < 1:
        raise ValueError("tp_size must be >= 1")
    if num_attention_heads is None:
        num_attention_heads = 16 * tp_size
    if num_layers < 2:
        raise ValueError("num_layers must be >= 2 (one dense and one MoE layer)")
    if not 1 <= first_k_dense_replace < num_layers:
        raise ValueError("need 1 <= first_k_dense_replace < num_layers (dense first, then MoE)")
    for name, val in [
        ("num_attention_heads", num_attention_heads),
        ("n_routed_experts", n_routed_experts),
        ("intermediate_size", intermediate_size),
        ("moe_intermediate_size", moe_intermediate_size),
    ]:
        if val % tp_size:
            raise ValueError(f"{name}={val} is not divisible by tp_size={tp_size}")
    if num_experts_per_tok > n_routed_experts:
        raise ValueError("num_experts_per_tok > n_routed_experts")
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "moe_intermediate_size": moe_intermediate_size,
        "num_hidden_layers": num_layers,
        "num_nextn_predict_layers": 0,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_attention_heads,
        "n_shared_experts": n_shared_experts,
        "n_routed_experts": n_routed_experts,
        "num_experts_per_tok": num_experts_per_tok,
        "routed_scaling_factor": 2.5,
        "ep_size": 1,
        "kv_lora_rank": kv_lora_rank,
        "q_lora_rank": q_lora_rank,
        "qk_rope_head_dim": qk_rope_head_dim,
        "qk_nope_head_dim": qk_nope_head_dim,
        "v_head_dim": v_head_dim,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "first_k_dense_replace": first_k_dense_replace,
        "moe_layer_freq": 1,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


def checkpoint_tensor_specs(cfg: Dict[str, Any]) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    """``name -> (shape, kind)`` for every tensor of the checkpoint."""
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    kvr = cfg["kv_lora_rank"]
    qr = cfg.get("q_lora_rank")
    specs: Dict[str, Tuple[Tuple[int, ...], str]] = {
        "model.embed_tokens.weight": ((cfg["vocab_size"], H), "embed"),
        "model.norm.weight": ((H,), "norm"),
        "lm_head.weight": ((cfg["vocab_size"], H), "lm_head"),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs[p + "input_layernorm.weight"] = ((H,), "norm")
        specs[p + "post_attention_layernorm.weight"] = ((H,), "norm")
        a = p + "self_attn."
        if qr:
            specs[a + "q_a_proj.weight"] = ((qr, H), "linear")
            specs[a + "q_a_layernorm.weight"] = ((qr,), "norm")
            specs[a + "q_b_proj.weight"] = ((nh * qk, qr), "linear")
        else:
            specs[a + "q_proj.weight"] = ((nh * qk, H), "linear")
        specs[a + "kv_a_proj_with_mqa.weight"] = ((kvr + cfg["qk_rope_head_dim"], H), "linear")
        specs[a + "kv_a_layernorm.weight"] = ((kvr,), "norm")
        specs[a + "kv_b_proj.weight"] = ((nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), kvr), "linear")
        specs[a + "o_proj.weight"] = ((H, nh * cfg["v_head_dim"]), "linear")
        m = p + "mlp."
        if i < cfg["first_k_dense_replace"]:
            inter = cfg["intermediate_size"]
            specs[m + "gate_proj.weight"] = ((inter, H), "linear")
            specs[m + "up_proj.weight"] = ((inter, H), "linear")
            specs[m + "down_proj.weight"] = ((H, inter), "linear")
            continue
        mi = cfg["moe_intermediate_size"]
        specs[m + "gate.weight"] = ((cfg["n_routed_experts"], H), "router")
        specs[m + "gate.e_score_correction_bias"] = ((cfg["n_routed_experts"],), "bias")
        for e in range(cfg["n_routed_experts"]):
            x = f"{m}experts.{e}."
            specs[x + "gate_proj.weight"] = ((mi, H), "linear")
            specs[x + "up_proj.weight"] = ((mi, H), "linear")
            specs[x + "down_proj.weight"] = ((H, mi), "linear")
        si = mi * cfg["n_shared_experts"]
        specs[m + "shared_experts.gate_proj.weight"] = ((si, H), "linear")
        specs[m + "shared_experts.up_proj.weight"] = ((si, H), "linear")
        specs[m + "shared_experts.down_proj.weight"] = ((H, si), "linear")
    return specs


def _tensor(name: str, shape: Tuple[int, ...], kind: str, seed: int, stds: Optional[Dict[str, float]] = None):
    import torch

    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    std = {**_STD, **(stds or {})}
    if kind == "norm":
        # Not all-ones, so a norm weight loaded into the wrong slot shows up.
        t = 1.0 + 0.1 * torch.randn(shape, generator=g)
    elif kind == "bias":
        # DeepSeek-V3 keeps the router correction bias in fp32.
        return (0.01 * torch.randn(shape, generator=g)).float()
    else:
        t = std[kind] * torch.randn(shape, generator=g)
    return t.to(torch.bfloat16)


def make_checkpoint_tensors(
    cfg: Dict[str, Any], seed: int = 0, stds: Optional[Dict[str, float]] = None
) -> Dict[str, Any]:
    """Every tensor, seeded per name; ``stds`` overrides the initial scale of a kind (``{"embed": 0.3}``)."""
    return {n: _tensor(n, s, k, seed, stds) for n, (s, k) in checkpoint_tensor_specs(cfg).items()}


def make_tiny_deepseek_v3(
    out_dir: PathLike,
    *,
    tp_size: int = 1,
    num_layers: int = 4,
    seed: int = 0,
    stds: Optional[Dict[str, float]] = None,
    **config_overrides: Any,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` of a tiny DeepSeek-V3.

    ``config_overrides`` go to :func:`tiny_deepseek_v3_config` (e.g. smaller
    ``hidden_size`` for CPU tests).  Same arguments -> byte-identical tensors.
    ``stds`` overrides a kind's initial scale: ``{"embed": 0.3}`` makes a
    target whose greedy output follows its input (at 0.02 it repeats one
    token), for a draft that has something to learn.
    """
    from safetensors.torch import save_file

    cfg = tiny_deepseek_v3_config(tp_size=tp_size, num_layers=num_layers, **config_overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = make_checkpoint_tensors(cfg, seed, stds)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    (out / CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n")
    (out / META_NAME).write_text(
        json.dumps({"kind": "tiny-deepseek-v3", "seed": seed, "tp_size": tp_size}, indent=2) + "\n"
    )
    return out


def read_config(model_dir: PathLike) -> Dict[str, Any]:
    return json.loads((Path(model_dir) / CONFIG_NAME).read_text())


def load_checkpoint_tensors(model_dir: PathLike) -> Dict[str, Any]:
    from safetensors.torch import load_file

    d = Path(model_dir)
    out: Dict[str, Any] = {}
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {d}")
    for f in files:
        out.update(load_file(str(f)))
    return out


def _hf_config(cfg: Dict[str, Any]):
    from transformers import DeepseekV3Config

    kw = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype", "model_type")}
    hf = DeepseekV3Config(**kw)
    hf._attn_implementation = "eager"  # plain math, no fused kernels
    return hf


def to_hf_state_dict(tensors: Dict[str, Any], hf_keys: Sequence[str], cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Original DeepSeek names -> the installed transformers' layout.

    transformers >= 5 stores routed experts as ``experts.gate_up_proj``
    ``[E, 2I, H]`` (gate rows first) and ``experts.down_proj`` ``[E, H, I]``;
    older versions keep one module per expert (same names as the checkpoint).
    """
    import torch

    keys = set(hf_keys)
    sd: Dict[str, Any] = {}
    for name, t in tensors.items():
        if ".mlp.experts." in name and name not in keys:
            continue  # packed below
        sd[name] = t
    for i in range(cfg["num_hidden_layers"]):
        m = f"model.layers.{i}.mlp.experts."
        if m + "gate_up_proj" in keys:
            E = cfg["n_routed_experts"]
            sd[m + "gate_up_proj"] = torch.stack(
                [
                    torch.cat([tensors[f"{m}{e}.gate_proj.weight"], tensors[f"{m}{e}.up_proj.weight"]], 0)
                    for e in range(E)
                ]
            )
            sd[m + "down_proj"] = torch.stack([tensors[f"{m}{e}.down_proj.weight"] for e in range(E)])
    return sd


def load_hf_reference_model(model_dir: PathLike):
    """``DeepseekV3ForCausalLM`` (fp32, eval, CPU) holding the checkpoint's weights.

    The bf16 weights are widened to fp32 exactly, so the reference runs the
    same weights as SGLang, in higher precision.  ``strict=True``: any name or
    shape the checkpoint gets wrong fails here.
    """
    from transformers import DeepseekV3ForCausalLM

    cfg = read_config(model_dir)
    model = DeepseekV3ForCausalLM(_hf_config(cfg))
    sd = to_hf_state_dict(load_checkpoint_tensors(model_dir), list(model.state_dict().keys()), cfg)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    # rotary inv_freq style buffers are not in checkpoints
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit DeepseekV3ForCausalLM: missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    return model.float().eval()


def hf_reference_hidden_states(model_or_dir: Any, token_ids: Sequence[int]) -> List[Any]:
    """Hugging Face ``hs[0..L]`` for one sequence, each ``[T, H]`` float32.

    ``hs[0]`` is the embedding output, ``hs[k]`` the output of decoder layer
    ``k-1``.  Runs on the model's device; returns CPU tensors.
    ``output_hidden_states=True`` gives the *final-normed* state as
    its last entry; it is replaced here by the pre-norm output of the last
    layer (captured with a forward hook), as the numbering above requires.
    """
    import torch

    model = load_hf_reference_model(model_or_dir) if isinstance(model_or_dir, (str, Path)) else model_or_dir
    device = next(model.parameters()).device
    ids = torch.as_tensor([list(token_ids)], dtype=torch.long, device=device)
    last: Dict[str, Any] = {}

    def hook(_mod, _inp, out):
        last["h"] = (out[0] if isinstance(out, tuple) else out).detach()

    layers = model.model.layers
    h = layers[len(layers) - 1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    finally:
        h.remove()
    hs = [t[0].float().cpu().clone() for t in out.hidden_states]
    if len(hs) != len(layers) + 1:
        raise RuntimeError(f"expected {len(layers) + 1} hidden states, got {len(hs)}")
    hs[-1] = last["h"][0].float().cpu().clone()
    return hs
