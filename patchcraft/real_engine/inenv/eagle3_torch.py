"""An EAGLE-3 draft's first step in plain torch, the way the engines compute it (stdlib + torch only).

The original layout both engines load (``fc``, ``midlayer.*``): ``fc`` over
the concatenated target states; one decoder layer whose attention takes
``[input_layernorm(embed(token t+1)), hidden_norm(fc)]`` (2H wide), neox
rope, the ``fc`` output as its residual; a final norm; its own ``lm_head``.
vLLM's ``llama_eagle3.py`` (``_norm_after_residual``) and SGLang's
``llama_eagle3.py`` compute this; training on it is what makes a tiny draft
accept tokens in a real engine.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding over the whole head (``[T, heads, d]``)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = positions.float()[:, None] * inv[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def draft_logits(p: dict[str, torch.Tensor], cfg: dict[str, Any], embeds: torch.Tensor, feats: torch.Tensor) -> Any:
    """The draft's logits over one sequence: ``embeds`` ``[T, H]`` (tokens t+1), ``feats`` ``[T, n*H]`` (states of t)."""
    eps, heads, head_dim = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["head_dim"]
    kv = cfg.get("num_key_value_heads", heads)
    theta = float(cfg.get("rope_theta", 10000.0))
    steps = feats.shape[0]
    positions = torch.arange(steps)
    h = feats @ p["fc.weight"].T
    residual = h
    x = torch.cat(
        [rms(embeds, p["midlayer.input_layernorm.weight"], eps), rms(h, p["midlayer.hidden_norm.weight"], eps)], -1
    )
    a = "midlayer.self_attn."
    q = rope((x @ p[a + "q_proj.weight"].T).view(steps, heads, head_dim), positions, theta)
    k = rope((x @ p[a + "k_proj.weight"].T).view(steps, kv, head_dim), positions, theta)
    v = (x @ p[a + "v_proj.weight"].T).view(steps, kv, head_dim)
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    o = o.transpose(0, 1).reshape(steps, heads * head_dim) @ p[a + "o_proj.weight"].T
    residual = o + residual
    hn = rms(residual, p["midlayer.post_attention_layernorm.weight"], eps)
    m = "midlayer.mlp."
    mlp = (F.silu(hn @ p[m + "gate_proj.weight"].T) * (hn @ p[m + "up_proj.weight"].T)) @ p[m + "down_proj.weight"].T
    return rms(mlp + residual, p["norm.weight"], eps) @ p["lm_head.weight"].T
