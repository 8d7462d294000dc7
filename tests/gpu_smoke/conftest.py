"""Shared fixtures for the CPU tests of patchcraft.gpu_smoke.

Needs only pytest for the pure-Python parts; torch / transformers /
safetensors tests skip cleanly when those are missing.  SGLang wheels are
read with zipfile (never installed or imported): found in
``$PATCHCRAFT_SGLANG_WHEELS`` (folders), else in the cache's ``wheels/``
or fetched there as ``patchcraft fetch`` does
(:func:`patchcraft.base.fetch.download_wheel`); offline -> skipped with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Small enough for a CPU test, same code path and layout as the GPU default.
SMALL_TARGET = dict(
    num_layers=4,
    first_k_dense_replace=1,
    hidden_size=128,
    vocab_size=256,
    num_attention_heads=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    intermediate_size=256,
    moe_intermediate_size=64,
    kv_lora_rank=64,
    q_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    max_position_embeddings=256,
)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # The models are tiny; two OpenMP threads on a busy 2-core box are ~100x
    # slower than one (spin-waiting), so pin the test process to one thread.
    try:
        import torch
    except ImportError:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def small_target_kw():
    return dict(SMALL_TARGET)


def _wheel(version: str) -> Path:
    """The ``sglang==version`` wheel: from ``$PATCHCRAFT_SGLANG_WHEELS``, the cache, or pip; skips when it cannot be had."""
    from patchcraft.base.errors import PatchcraftError
    from patchcraft.base.fetch import cache_dir, download_wheel, find_wheel

    for folder in os.environ.get("PATCHCRAFT_SGLANG_WHEELS", "").split(os.pathsep):
        found = find_wheel(Path(folder), version) if folder else None
        if found is not None:
            return found
    try:
        return download_wheel(version, cache_dir() / "wheels")
    except PatchcraftError as e:
        pytest.skip(f"sglang=={version} wheel unavailable (offline?): {e}")


@pytest.fixture(scope="session", params=["0.5.10", "0.5.23"])
def sglang_wheel(request):
    return _wheel(request.param)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from patchcraft.gpu_smoke.checkpoint import make_tiny_deepseek_v3

    return make_tiny_deepseek_v3(tmp_path_factory.mktemp("target"), tp_size=2, **SMALL_TARGET)


@pytest.fixture(scope="session")
def hf_model(tiny_target):
    pytest.importorskip("transformers")
    try:
        from transformers import DeepseekV3ForCausalLM  # noqa: F401
    except ImportError:
        pytest.skip("installed transformers has no DeepseekV3ForCausalLM")
    from patchcraft.gpu_smoke.checkpoint import load_hf_reference_model

    return load_hf_reference_model(tiny_target)
