"""Tiny random targets and EAGLE-3 drafts, and the target's own per-layer states (stdlib + torch + transformers).

Runs inside an engine environment. A target is a Hugging Face model of its
family built from a seeded config (random weights, ``save_pretrained``), so
the engine loads it as it loads a real checkpoint and transformers computes
the reference: ``hs[0]`` the embedding output, ``hs[k]`` the output of
decoder layer ``k-1`` *before* the final norm (forward hooks on the layers:
transformers' own ``hidden_states[-1]`` is after the norm). A draft is an
EAGLE-3 head in the original layout (``fc``, ``midlayer.*``), random unless
a trained one is given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: A YaRN rope of factor 1 (a rotation like plain RoPE): the tiny DeepSeek targets' ``rope_scaling``, both engines.
YARN_FACTOR_1 = {
    "type": "yarn",
    "rope_type": "yarn",
    "factor": 1.0,
    "original_max_position_embeddings": 1024,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

#: family -> (transformers config class, model class, config overrides). Sizes the CPU engines accept:
#: head_dim 32 (CPU attention), MLA's kv_lora_rank 512 and rope dim 64 (CPU MLA).
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1},
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            "kv_lora_rank": 512,
            "q_lora_rank": None,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 32,
            "v_head_dim": 32,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 1.0,
            "topk_method": "noaux_tc",
            "moe_layer_freq": 1,
        },
    ),
}

HIDDEN = 128
HEADS = 4
HEAD_DIM = 32
VOCAB = 512


def base_config(family: str, num_layers: int) -> dict[str, Any]:
    _, model_class, overrides = FAMILIES[family]
    config: dict[str, Any] = {
        "hidden_size": HIDDEN,
        "intermediate_size": 256,
        "num_hidden_layers": num_layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "architectures": [model_class],
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if family == "deepseek_v3":  # MLA: the rotary part is the head_dim transformers rotates
        config["num_key_value_heads"] = HEADS
        config["head_dim"] = 64
    config.update(overrides)
    return config


def build_target(family: str, num_layers: int, folder: Path, seed: int, embed_std: float = 0.08) -> Path:
    """A random target of ``family`` saved as a Hugging Face checkpoint in ``folder``; returns the folder.

    ``embed_std``: the embedding's scale (larger: a greedy output that follows its input, something to learn)."""
    import torch
    import transformers

    config_class, model_class, _ = FAMILIES[family]
    config = getattr(transformers, config_class)(**base_config(family, num_layers))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).to(torch.float32).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # larger than the init's 0.02 std: distinct states per layer
            parameter.normal_(0.0, 0.08) if parameter.dim() > 1 else parameter.uniform_(0.8, 1.2)
        model.model.embed_tokens.weight.normal_(0.0, embed_std)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def build_tokenizer(folder: Path) -> None:
    """A word-level tokenizer of the tiny vocabulary (token k is the word ``tk``), for a server that detokenizes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{k}": k for k in range(VOCAB)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0", bos_token="t1", eos_token="t2")
    tokenizer.save_pretrained(folder)


def load_target(family: str, folder: Path) -> Any:
    import torch
    import transformers

    _, model_class, _ = FAMILIES[family]
    return getattr(transformers, model_class).from_pretrained(folder, torch_dtype=torch.float32).eval()


def reference_states(family: str, folder: Path, token_ids: list[int]) -> list[Any]:
    """``[hs[0], ..., hs[L]]`` of the target in ``folder`` for one sequence, each ``[len(token_ids), H]``."""
    return states_of(load_target(family, folder), token_ids)


def states_of(model: Any, token_ids: list[int]) -> list[Any]:
    """``[hs[0], ..., hs[L]]`` of a loaded target for one sequence (forward hooks: before the final norm)."""
    import torch

    states: list[Any] = []
    inner = model.model
    hooks = [inner.embed_tokens.register_forward_hook(lambda _m, _i, out: states.append(out[0].detach().clone()))]
    for layer in inner.layers:
        hooks.append(
            layer.register_forward_hook(
                lambda _m, _i, out: states.append((out[0] if isinstance(out, tuple) else out)[0].detach().clone())
            )
        )
    with torch.no_grad():
        model(torch.tensor([token_ids]))
    for hook in hooks:
        hook.remove()
    return states


def reference_greedy(family: str, folder: Path, token_ids: list[int], max_tokens: int) -> list[int]:
    return greedy_of(load_target(family, folder), token_ids, max_tokens)


def greedy_of(model: Any, token_ids: list[int], max_tokens: int) -> list[int]:
    import torch

    ids = list(token_ids)
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(token_ids) :]


def build_draft(target: dict[str, Any], layer_ids: list[int], folder: Path, seed: int, arch: str) -> Path:
    """A random EAGLE-3 draft for ``target``'s config, its ids at top level and in ``eagle_config``."""
    config = draft_config(target, layer_ids, arch)
    if config["model_type"] == "deepseek_v2":
        return _deepseek_draft(target, config, layer_ids, folder, _random(seed))
    return save_draft(folder, config, draft_tensors(len(layer_ids), target["vocab_size"], seed))


def draft_config(target: dict[str, Any], layer_ids: list[int], arch: str = "LlamaForCausalLMEagle3") -> dict[str, Any]:
    """The config.json of an EAGLE-3 draft for ``target`` whose ids are ``layer_ids``."""
    return {
        "architectures": [arch],
        "model_type": "deepseek_v2" if arch.startswith("Eagle3Deepseek") else "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 256,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 1,
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": target["vocab_size"],
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "target_hidden_size": HIDDEN,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
    }


def _random(seed: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(seed + 1)

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator) * 0.05

    return rand


def save_draft(folder: Path, config: dict[str, Any], tensors: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder


def draft_tensors(n: int, vocab: int, seed: int, hidden: int = HIDDEN, kv_heads: int = 2) -> dict[str, Any]:
    """A random Llama-layout EAGLE-3 head (``fc`` over ``n`` states, one ``midlayer``, its own ``lm_head``)."""
    import torch

    heads, kv, head_dim, inter = HEADS, kv_heads, HEAD_DIM, 256
    rand = _random(seed)
    return {
        "fc.weight": rand(hidden, n * hidden),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden),
        "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": rand(vocab, hidden),
    }


def _deepseek_draft(
    target: dict[str, Any], config: dict[str, Any], layer_ids: list[int], folder: Path, rand: Any
) -> Path:
    """vLLM's Eagle3DeepseekV2 draft: one MLA decoder layer (its attention takes embedding + state, 2H) and a dense MLP."""
    import torch
    from safetensors.torch import save_file

    mla = {k: target[k] for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    # q_lora_rank set: vLLM's draft loader fuses q_a_proj with kv_a_proj_with_mqa (fused_qkv_a_proj).
    config.update(mla, q_lora_rank=64, num_key_value_heads=target["num_attention_heads"])
    config["num_attention_heads"] = heads = target["num_attention_heads"]
    hidden, inter, vocab = HIDDEN, 256, target["vocab_size"]
    nope, rope, v, rank = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"], mla["kv_lora_rank"]
    layer = "layers.0."
    tensors = {
        "fc.weight": rand(hidden, len(layer_ids) * hidden),
        layer + "self_attn.q_a_proj.weight": rand(64, 2 * hidden),
        layer + "self_attn.q_a_layernorm.weight": torch.ones(64),
        layer + "self_attn.q_b_proj.weight": rand(heads * (nope + rope), 64),
        layer + "self_attn.kv_a_proj_with_mqa.weight": rand(rank + rope, 2 * hidden),
        layer + "self_attn.kv_a_layernorm.weight": torch.ones(rank),
        layer + "self_attn.kv_b_proj.weight": rand(heads * (nope + v), rank),
        layer + "self_attn.o_proj.weight": rand(hidden, heads * v),
        layer + "mlp.gate_proj.weight": rand(inter, hidden),
        layer + "mlp.up_proj.weight": rand(inter, hidden),
        layer + "mlp.down_proj.weight": rand(hidden, inter),
        layer + "input_layernorm.weight": torch.ones(hidden),
        layer + "hidden_norm.weight": torch.ones(hidden),
        layer + "post_attention_layernorm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": rand(vocab, hidden),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: t.contiguous() for k, t in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder


def match_states(fed: Any, states: list[Any], rows: int) -> list[dict[str, Any]]:
    """Each third of ``fed`` (its first ``rows`` rows: the prompt) against every ``hs[k]``: the state it equals."""
    import torch

    hidden = states[0].shape[-1]
    count = fed.shape[-1] // hidden
    slots = []
    for slot in range(count):
        chunk = fed[:rows, slot * hidden : (slot + 1) * hidden].float()
        diffs = []
        for k, state in enumerate(states):
            scale = float(state[:rows].abs().max()) or 1.0
            diffs.append((float((chunk - state[:rows].float()).abs().max()) / scale, k))
        diffs.sort()
        best, k = diffs[0]
        other = diffs[1] if len(diffs) > 1 else (float("inf"), -1)
        matched = best < 1e-3 and other[0] > 10 * best
        slots.append(
            {
                "slot": slot,
                "state": f"hs[{k}]" if matched else None,
                "max_rel_diff": best,
                "nearest": f"hs[{k}]",
                "next_nearest": f"hs[{other[1]}]",
                "next_rel_diff": other[0],
            }
        )
    return slots
