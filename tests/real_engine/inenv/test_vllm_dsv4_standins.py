"""The DeepSeek-V4 CPU stand-ins' pure-torch logic (no vLLM needed; the engine tier checks them against vLLM's own
references, tests/real_engine/test_vllm_engine.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from patchcraft.real_engine import check
from patchcraft.real_engine.inenv import vllm_dsv4_standins as standins


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_a_cache_row_round_trips_within_fp8() -> None:
    row = torch.randn(512, generator=_generator())
    back = standins.unpack_rows(standins.pack_row(row).unsqueeze(0))[0]
    assert standins.pack_row(row).shape == (standins.ROW,)
    assert torch.equal(back[448:], row[448:].to(torch.bfloat16).float())  # the rope part: bf16, exact
    assert float((back[:448] - row[:448]).abs().max()) < 0.07 * float(row[:448].abs().max())  # fp8 e4m3


def test_attention_is_softmax_with_a_sink_over_valid_keys() -> None:
    g = _generator()
    q, k = torch.randn(3, 2, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    valid = torch.ones(3, 5, dtype=torch.bool)
    valid[:, 3:] = False
    sink = torch.tensor([0.5, -1.0])
    out = torch.empty(3, 2, 8)
    standins.attention_out(out, q, k, valid, sink, 0.3)
    for t in range(3):
        for h in range(2):
            logits = torch.cat([(k[t, :3] @ q[t, h]) * 0.3, sink[h : h + 1]])
            weights = torch.softmax(logits, 0)[:3]
            assert torch.allclose(out[t, h], weights @ k[t, :3], atol=1e-5)


def test_rope_and_its_inverse_cancel_on_the_tail_only() -> None:
    g = _generator()
    x = torch.randn(4, 2, 16, generator=g)
    angles = torch.randn(32, 4, generator=g)
    cache = torch.cat([angles.cos(), angles.sin()], -1)
    positions = torch.tensor([0, 5, 9, 31])
    roped = standins.rope_tail(x, positions, cache)
    assert torch.equal(roped[..., :8], x[..., :8]) and not torch.allclose(roped[..., 8:], x[..., 8:])
    assert torch.allclose(standins.rope_tail(roped, positions, cache, inverse=True), x, atol=1e-5)


def test_token_to_request_indices() -> None:
    out = torch.full((8,), -1, dtype=torch.int32)
    got = standins.token_to_req_indices(torch.tensor([0, 3, 4, 7]), out, 6, 8)
    assert got.tolist() == [0, 0, 0, 1, 2, 2, 0, 0]


def test_biased_topk_selects_with_the_bias_and_weighs_without_it() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    weights, ids = standins.biased_topk_cpu(
        logits, logits, torch.tensor([0.0, 0.0, 5.0, 0.0]), 2, True, "", 0, 1.5, True
    )
    assert ids.tolist() == [[2, 0]] and torch.allclose(weights.sum(), torch.tensor(1.5))


def test_the_stand_in_list_names_every_kernel_and_the_text_says_so() -> None:
    result = {
        "standins": [*standins.KERNELS, "build_tile_scheduler (c1a, c2a keys)"],
        "standin_kernels": list(standins.KERNELS),
        "isa": {},
    }
    text = check.tier(result)
    assert "vLLM's own Python model code with 10 stand-in CPU kernels (this CPU lacks AVX-512/AMX)" in text
    assert "c1a" in text and "the real engine" not in text
    assert "1 other stand-ins: build_tile_scheduler" in text
    unnamed = check.tier({**result, "standin_kernels": []})  # what the engine did not name a kernel is not one
    assert "with 0 stand-in CPU kernels" in unnamed and "11 other stand-ins" in unnamed
    assert check.tier({}) == "its CPU build, the real engine"
