"""The stand-ins SGLang's EAGLE-3 draft code runs on in ``patchcraft probe`` (:mod:`patchcraft.harness.draft_probe`).

The release's draft methods are compiled and run for real; what they call
is here: linear layers (with the ``weight_loader`` hook ``load_weights``
calls), RMSNorm in SGLang's fused add form, rotary embedding, causal
attention over one sequence (the draft-extend prefill), SiLU-and-mul, the
forward mode and the batch the forward reads, and :func:`standin_module`,
which gives a compiled class its methods and attributes.
"""

from __future__ import annotations

import copy
from types import FunctionType, SimpleNamespace
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from patchcraft.harness.standins import HarnessError


def default_weight_loader(param: Any, tensor: Any, *args: Any) -> None:
    """SGLang's fallback loader: every probe parameter has its own ``weight_loader``, so this is never reached."""
    raise HarnessError("a parameter without a weight_loader was loaded")


#: The free names of the draft code that are no module attribute: plain torch, and the loader fallback.
DRAFT_NAMES: dict[str, Any] = {
    "torch": torch,
    "nn": nn,
    "copy": copy,
    "_is_npu": False,
    "default_weight_loader": default_weight_loader,
}


class ProbeLinear(nn.Module):
    """SGLang's parallel linear layers at TP 1: ``(x @ W.T + b, None)``; extra keywords ignored."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, pair: bool = True) -> None:
        super().__init__()
        self.weight, self.bias, self.pair = weight, bias, pair

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = F.linear(x, self.weight, self.bias)
        return (out, None) if self.pair else out


class ProbeRMSNorm(nn.Module):
    """SGLang's ``RMSNorm``: ``norm(x)``, or with a residual ``x + residual`` normed and returned as the new residual."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = weight, eps

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Any:
        dtype = x.dtype
        value = x.float()
        if residual is not None:
            value = value + residual.float()
            residual = value.to(dtype)
        variance = value.pow(2).mean(-1, keepdim=True)
        value = value * torch.rsqrt(variance + self.eps)
        out = (value * self.weight.float()).to(dtype)
        return out if residual is None else (out, residual)


class ProbeEmbedding(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids.long()]


class ProbeRotary(nn.Module):
    """``get_rope``'s default (neox-style) rotary embedding: ``(positions, q, k) -> (q, k)``."""

    def __init__(self, head_dim: int, rotary_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim, self.is_neox_style = head_dim, rotary_dim, True
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, self.head_dim)
        rot, rest = x[..., : self.rotary_dim].float(), x[..., self.rotary_dim :]
        half = self.rotary_dim // 2
        x1, x2 = rot[..., :half], rot[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        rotated = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
        return torch.cat([rotated, rest], dim=-1).reshape(shape)


class ProbeAttention(nn.Module):
    """``RadixAttention`` for one sequence's prefill: causal attention, grouped KV heads."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, scaling: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.scaling = heads, kv_heads, head_dim, scaling
        self.layer_id = 0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: Any, **kwargs: Any) -> Any:
        tokens = q.shape[0]
        q = q.view(tokens, self.heads, self.head_dim).transpose(0, 1)
        k = k.view(tokens, self.kv_heads, self.head_dim).transpose(0, 1)
        v = v.view(tokens, self.kv_heads, self.head_dim).transpose(0, 1)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=0)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
        return out.transpose(0, 1).reshape(tokens, self.heads * self.head_dim)


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]


class NoDualGemm:
    def can_run(self, *args: Any, **kwargs: Any) -> bool:
        return False


class ForwardMode:
    """A draft-extend prefill: an extend, a draft extend, never decode or idle."""

    def is_extend(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def is_draft_extend(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def is_draft_extend_v2(self) -> bool:
        return True

    def is_decode(self) -> bool:
        return False

    def is_idle(self) -> bool:
        return False

    def is_target_verify(self) -> bool:
        return False


class DraftBatch:
    """The ``forward_batch`` of one sequence: its concatenated target states and nothing multimodal."""

    def __init__(self, hidden_states: torch.Tensor) -> None:
        self.spec_info = SimpleNamespace(hidden_states=hidden_states)
        self.forward_mode = ForwardMode()
        self.mm_input_embeds = None

    def contains_mm_inputs(self) -> bool:
        return False


def standin_module(name: str, methods: Mapping[str, FunctionType], attributes: Mapping[str, Any]) -> nn.Module:
    """A module named as SGLang's class, with its compiled methods and the attributes the forward reads."""
    instance = type(name, (nn.Module,), dict(methods))()
    for key, value in attributes.items():
        setattr(instance, key, value)
    return instance
