"""The tiny targets and drafts of an SGLang CPU engine run, and the target's own answers from transformers.

DeepSeek-V3 comes from patchcraft's ``gpu_smoke/checkpoint.py`` (original
DeepSeek tensor names, per-tensor seeded), scaled down to a CPU (3 layers,
4 routed experts + 1 shared, MLA geometry kept), with the yarn
``rope_scaling`` SGLang's CPU rotary embedding asks for
(``rotary_embedding/factory.py``: only deepseek_yarn on CPU) at factor 1, which is
plain rope, so transformers computes the same. Llama is written here. The
EAGLE-3 draft is ``gpu_smoke/draft_builder.py``'s. Both gpu_smoke modules are
standalone and loaded by path.

The reference states ``hs[0..L]`` are transformers' forward in fp32:
``hs[0]`` the embedding output, ``hs[k]`` the output of layer ``k-1``
(before the final norm).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_runtime import load_standalone
from tiny_models import YARN_FACTOR_1

FAMILIES = ("llama", "deepseek_v3")


def deepseek_config_overrides(num_layers: int) -> dict[str, Any]:
    return {
        "num_layers": num_layers,
        "first_k_dense_replace": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 512,
        "moe_intermediate_size": 256,
        "max_position_embeddings": 1024,
    }


def llama_config(num_layers: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 1024,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "initializer_range": 0.15,  # transformers' 0.02 gives near-uniform logits: one token over and over
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "float32",
    }


def build_target(family: str, num_layers: int, out: Path, seed: int) -> Path:
    """Write the tiny target of ``family`` into ``out`` (same arguments, same bytes)."""
    if family == "deepseek_v3":
        checkpoint = load_standalone("checkpoint")
        checkpoint.make_tiny_deepseek_v3(out, seed=seed, **deepseek_config_overrides(num_layers))
        config = json.loads((out / "config.json").read_text())
        config["rope_scaling"] = dict(YARN_FACTOR_1)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = llama_config(num_layers)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures",)}))
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def build_draft(target: Path, layer_ids: Sequence[int], out: Path, seed: int) -> Path:
    draft_builder = load_standalone("draft_builder")
    return Path(draft_builder.make_tiny_eagle3_draft(out, target, list(layer_ids), seed=seed))


def reference_model(family: str, target: Path) -> Any:
    """transformers' model of the target, fp32, eval."""
    if family == "deepseek_v3":
        checkpoint = load_standalone("checkpoint")
        return checkpoint.load_hf_reference_model(target)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), torch_dtype="float32", attn_implementation="eager")
    return model.float().eval()


def hidden_states(model: Any, token_ids: Sequence[int]) -> list[Any]:
    """``hs[0..L]`` for one sequence, each ``[T, H]`` fp32 (gpu_smoke/checkpoint.py's reading)."""
    checkpoint = load_standalone("checkpoint")
    return list(checkpoint.hf_reference_hidden_states(model, list(token_ids)))


def greedy(model: Any, token_ids: Sequence[int], max_tokens: int, eos: Optional[int] = None) -> list[int]:
    """The target alone, greedy, full forward each step (no cache: tiny models, exact)."""
    import torch

    ids = list(token_ids)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            token = int(torch.argmax(logits).item())
            out.append(token)
            ids.append(token)
            if eos is not None and token == eos:
                break
    return out
