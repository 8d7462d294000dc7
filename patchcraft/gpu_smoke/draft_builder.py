"""Tiny random EAGLE-3 draft in SGLang's ``LlamaForCausalLMEagle3`` format.

Layout (as read by ``sglang/srt/models/llama_eagle3.py``, 0.5.x):

* ``config.json``: a Llama config with ``architectures =
  ["LlamaForCausalLMEagle3"]``, ``num_hidden_layers = 1``,
  ``target_hidden_size``, ``draft_vocab_size`` and ``eagle_config =
  {"eagle_aux_hidden_state_layer_ids": [...], "use_aux_hidden_state": true}``.
* weights with the original EAGLE-3 names: ``fc.weight`` ``[H, 3 * H_target]``,
  ``midlayer.*`` (q/k/v projections take ``2 * H``: embedding and hidden state
  concatenated), ``norm.weight``, ``lm_head.weight``, ``d2t``/``t2d`` vocab maps
  and ``embed_tokens.weight`` (SGLang replaces it with the target's).

0.5.23 renames ``midlayer`` to ``layers.0`` on load and sizes ``fc`` by the
number of aux ids, so the same files load in both eras.
"""

from __future__ import annotations

import ast
import json
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

PathLike = Union[str, Path]

ARCHITECTURE = "LlamaForCausalLMEagle3"
NUM_AUX = 3  # SGLang 0.5.10 hard-codes fc = Linear(3 * target_hidden, hidden)


def _pick_heads(hidden: int, tp_size: int) -> Tuple[int, int]:
    """(num_heads, head_dim) with head_dim in {128, 64} and heads % tp == 0."""
    for hd in (128, 64):
        if hidden % hd == 0 and (hidden // hd) % tp_size == 0:
            return hidden // hd, hd
    raise ValueError(f"cannot split hidden_size={hidden} into heads divisible by tp={tp_size}")


def eagle3_draft_config(
    target_config: Dict[str, Any],
    layer_ids: Sequence[int],
    *,
    tp_size: int = 1,
    intermediate_size: Optional[int] = None,
    num_attention_heads: Optional[int] = None,
    draft_vocab_size: Optional[int] = None,
) -> Dict[str, Any]:
    """Draft ``config.json`` matching ``target_config`` (hidden size, vocab).

    The draft's hidden size equals the target's: SGLang shares the target's
    embedding with an EAGLE-3 draft.
    """
    layer_ids = [int(x) for x in layer_ids]
    if len(layer_ids) != NUM_AUX:
        raise ValueError(f"EAGLE-3 drafts take exactly {NUM_AUX} aux layer ids, got {layer_ids}")
    text_cfg = target_config.get("text_config") or target_config  # multimodal targets (Kimi-K2.5)
    n_layers = int(text_cfg["num_hidden_layers"])
    for lid in layer_ids:
        if lid < -1 or lid >= n_layers:
            raise ValueError(f"layer id {lid} out of range for a {n_layers}-layer target")
    H = int(text_cfg["hidden_size"])
    vocab = int(text_cfg["vocab_size"])
    if num_attention_heads is None:
        num_attention_heads, head_dim = _pick_heads(H, tp_size)
    else:
        if H % num_attention_heads or num_attention_heads % tp_size:
            raise ValueError("num_attention_heads must divide hidden_size and be divisible by tp")
        head_dim = H // num_attention_heads
    inter = int(intermediate_size or 2 * H)
    if inter % tp_size:
        raise ValueError(f"intermediate_size={inter} not divisible by tp={tp_size}")
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": H,
        "target_hidden_size": H,
        "intermediate_size": inter,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_attention_heads,
        "head_dim": head_dim,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "draft_vocab_size": int(draft_vocab_size or vocab),
        "max_position_embeddings": int(text_cfg.get("max_position_embeddings", 4096)),
        "rms_norm_eps": float(text_cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(text_cfg.get("rope_theta", 10000.0)),
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": text_cfg.get("bos_token_id", 0),
        "eos_token_id": text_cfg.get("eos_token_id", 1),
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": layer_ids,
            "use_aux_hidden_state": True,
        },
    }


def draft_tensor_specs(cfg: Dict[str, Any]) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    """``name -> (shape, kind)`` of the draft's weights."""
    H = cfg["hidden_size"]
    Ht = cfg.get("target_hidden_size", H)
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter, V, dv = cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    L = "midlayer."
    return {
        "embed_tokens.weight": ((V, H), "linear"),
        "fc.weight": ((H, NUM_AUX * Ht), "linear"),
        L + "input_layernorm.weight": ((H,), "norm"),
        L + "hidden_norm.weight": ((H,), "norm"),
        L + "post_attention_layernorm.weight": ((H,), "norm"),
        L + "self_attn.q_proj.weight": ((nh * hd, 2 * H), "linear"),
        L + "self_attn.k_proj.weight": ((nkv * hd, 2 * H), "linear"),
        L + "self_attn.v_proj.weight": ((nkv * hd, 2 * H), "linear"),
        L + "self_attn.o_proj.weight": ((H, nh * hd), "linear"),
        L + "mlp.gate_proj.weight": ((inter, H), "linear"),
        L + "mlp.up_proj.weight": ((inter, H), "linear"),
        L + "mlp.down_proj.weight": ((H, inter), "linear"),
        "norm.weight": ((H,), "norm"),
        "lm_head.weight": ((dv, H), "linear"),
        "d2t": ((dv,), "d2t"),
        "t2d": ((V,), "t2d"),
    }


def make_draft_tensors(cfg: Dict[str, Any], seed: int = 0) -> Dict[str, Any]:
    import torch

    out: Dict[str, Any] = {}
    for name, (shape, kind) in draft_tensor_specs(cfg).items():
        g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(b"draft/" + name.encode())) % (2**63))
        if kind == "norm":
            out[name] = (1.0 + 0.1 * torch.randn(shape, generator=g)).to(torch.bfloat16)
        elif kind == "d2t":
            # draft id + d2t[draft id] = target id; identity map when vocabularies agree
            out[name] = torch.zeros(shape, dtype=torch.int64)
        elif kind == "t2d":
            out[name] = torch.ones(shape, dtype=torch.bool)
        else:
            out[name] = (0.02 * torch.randn(shape, generator=g)).to(torch.bfloat16)
    return out


def make_tiny_eagle3_draft(
    out_dir: PathLike,
    target: Union[PathLike, Dict[str, Any]],
    layer_ids: Sequence[int] = (-1, 1, 2),
    *,
    tp_size: int = 1,
    seed: int = 0,
    **config_kw: Any,
) -> Path:
    """Write a random EAGLE-3 draft for ``target`` (a model dir or its config dict)."""
    from safetensors.torch import save_file

    tcfg = target if isinstance(target, dict) else json.loads((Path(target) / "config.json").read_text())
    cfg = eagle3_draft_config(tcfg, layer_ids, tp_size=tp_size, **config_kw)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(make_draft_tensors(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def draft_layer_ids(draft_dir: PathLike) -> List[int]:
    cfg = json.loads((Path(draft_dir) / "config.json").read_text())
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        raise ValueError(f"{draft_dir}/config.json has no eagle_config.eagle_aux_hidden_state_layer_ids")
    return [int(x) for x in ids]


# --------------------------------------------------------------------------
# CPU check of the weight names against a release's llama_eagle3.py
# --------------------------------------------------------------------------

# LlamaForCausalLM.load_weights' mapping (sglang/srt/models/llama.py)
_LLAMA_STACKED = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]


def _literal_assign(fn: ast.FunctionDef, name: str) -> Any:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def sglang_eagle3_params(llama_eagle3_src: str) -> Set[str]:
    """Parameter names of SGLang's ``LlamaForCausalLMEagle3`` (one draft layer).

    The decoder-layer internals (``qkv_proj``, ``gate_up_proj``, norms) come
    from SGLang's Llama layer and are stable; whether the single layer is
    ``model.midlayer`` (<= 0.5.2x) or ``model.layers.0`` is read from source.
    """
    tree = ast.parse(llama_eagle3_src)
    attrs: Set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Store)
        ):
            attrs.add(node.attr)
    for needed in ("fc", "norm", "embed_tokens", "hidden_norm", "lm_head"):
        if needed not in attrs:
            raise ValueError(f"llama_eagle3.py assigns no self.{needed}; layout changed")
    layer = "model.midlayer." if "midlayer" in attrs else "model.layers.0."
    return {
        "model.embed_tokens.weight",
        "model.fc.weight",
        "model.norm.weight",
        "lm_head.weight",
        layer + "self_attn.qkv_proj.weight",
        layer + "self_attn.o_proj.weight",
        layer + "mlp.gate_up_proj.weight",
        layer + "mlp.down_proj.weight",
        layer + "input_layernorm.weight",
        layer + "post_attention_layernorm.weight",
        layer + "hidden_norm.weight",
    }


def simulate_sglang_eagle3_load(weight_names: Sequence[str], llama_eagle3_src: str) -> Dict[str, Any]:
    """Replay ``LlamaForCausalLMEagle3.load_weights``' name mapping on ``weight_names``.

    Returns ``{"loaded": {param: [weights]}, "ignored": [...], "unmatched": [...],
    "params_not_loaded": [...]}``.  ``unmatched`` weights are silently dropped by
    SGLang, so any entry there (or a parameter other than the shared
    embedding never loaded) is a format bug.
    """
    tree = ast.parse(llama_eagle3_src)
    load_fn = next(
        (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "load_weights"),
        None,
    )
    if load_fn is None:
        raise ValueError("llama_eagle3.py has no load_weights")
    stacked = _literal_assign(load_fn, "stacked_params_mapping")
    if stacked is None and "super().load_weights" in ast.unparse(load_fn):
        # <= 0.4.x: delegates to LlamaForCausalLM.load_weights with model. prefix
        stacked = _LLAMA_STACKED
    stacked = stacked or []
    legacy = _literal_assign(load_fn, "legacy_name_map") or {}
    params = sglang_eagle3_params(llama_eagle3_src)
    loaded: Dict[str, List[str]] = {}
    ignored: List[str] = []
    unmatched: List[str] = []
    for orig in weight_names:
        name = orig
        if "d2t" in name or "t2d" in name:
            ignored.append(orig)
            continue
        for old, new in legacy.items():
            if old in name:
                name = name.replace(old, new)
        target = None
        for param_name, shard_name, _sid in stacked:
            if shard_name not in name:
                continue
            name = name.replace(shard_name, param_name)
            target = name if name in params else f"model.{name}"
            break
        else:
            target = name if name in params else f"model.{name}"
        if target in params:
            loaded.setdefault(target, []).append(orig)
        else:
            unmatched.append(orig)
    return {
        "loaded": loaded,
        "ignored": ignored,
        "unmatched": unmatched,
        "params_not_loaded": sorted(params - set(loaded)),
    }
