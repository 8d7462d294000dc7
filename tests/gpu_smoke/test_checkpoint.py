import hashlib
import json

import pytest

from patchcraft.gpu_smoke.checkpoint import (
    checkpoint_tensor_specs,
    tiny_deepseek_v3_config,
)


def test_default_config_is_deepseek_v3_and_tp_friendly():
    for tp in (1, 2, 4, 8):
        cfg = tiny_deepseek_v3_config(tp_size=tp)
        assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
        assert cfg["model_type"] == "deepseek_v3"
        assert cfg["first_k_dense_replace"] >= 1
        assert cfg["num_hidden_layers"] > cfg["first_k_dense_replace"]
        assert cfg["n_routed_experts"] % tp == 0 and cfg["num_attention_heads"] % tp == 0
        # MLA geometry SGLang's kernels are built for
        assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (512, 64)
        assert cfg["topk_method"] == "noaux_tc" and cfg["scoring_func"] == "sigmoid"
        assert cfg["num_attention_heads"] // tp == 16  # DeepSeek-V3's per-rank head count at tp 8


@pytest.mark.parametrize(
    "kw",
    [
        dict(tp_size=3),  # 8 experts not divisible by 3
        dict(tp_size=2, num_attention_heads=5),
        dict(first_k_dense_replace=0),
        dict(num_layers=4, first_k_dense_replace=4),
        dict(num_layers=1),
        dict(tp_size=2, n_routed_experts=5),
    ],
)
def test_config_rejects_bad_geometry(kw):
    with pytest.raises(ValueError):
        tiny_deepseek_v3_config(**kw)


def test_tensor_table_has_dense_and_moe_layers():
    cfg = tiny_deepseek_v3_config()
    specs = checkpoint_tensor_specs(cfg)
    assert "model.layers.0.mlp.gate_proj.weight" in specs
    assert "model.layers.0.mlp.gate.weight" not in specs
    assert specs["model.layers.1.mlp.gate.weight"][0] == (8, 512)
    assert specs["model.layers.3.mlp.experts.7.down_proj.weight"][0] == (512, 512)
    assert specs["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"][0] == (576, 512)


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_checkpoint_is_deterministic(tmp_path, small_target_kw):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from patchcraft.gpu_smoke.checkpoint import make_tiny_deepseek_v3

    a = make_tiny_deepseek_v3(tmp_path / "a", **small_target_kw)
    b = make_tiny_deepseek_v3(tmp_path / "b", **small_target_kw)
    c = make_tiny_deepseek_v3(tmp_path / "c", seed=1, **small_target_kw)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 4 and cfg["hidden_size"] == 128


def test_checkpoint_loads_strictly_into_hf_class(tiny_target, hf_model):
    from safetensors.torch import load_file

    names = set(load_file(str(tiny_target / "model.safetensors")))
    assert "model.layers.2.mlp.experts.3.up_proj.weight" in names  # original per-expert names
    assert len(hf_model.model.layers) == 4
    # the MoE layers really are MoE in HF's implementation
    assert hasattr(hf_model.model.layers[1].mlp, "experts")
    assert not hasattr(hf_model.model.layers[0].mlp, "experts")


def test_checkpoint_with_a_missing_tensor_is_rejected(tiny_target, tmp_path, hf_model):
    import shutil

    from safetensors.torch import load_file, save_file

    from patchcraft.gpu_smoke.checkpoint import load_hf_reference_model

    bad = tmp_path / "bad"
    shutil.copytree(tiny_target, bad)
    t = load_file(str(bad / "model.safetensors"))
    del t["model.layers.1.self_attn.kv_b_proj.weight"]
    save_file(t, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="kv_b_proj"):
        load_hf_reference_model(bad)


def test_reference_hidden_states(hf_model):
    import torch

    from patchcraft.gpu_smoke.checkpoint import hf_reference_hidden_states

    ids = [5, 17, 200, 3, 3, 99, 42]
    hs = hf_reference_hidden_states(hf_model, ids)
    assert len(hs) == 5 and all(h.shape == (7, 128) and h.dtype == torch.float32 for h in hs)
    # hs[0] is exactly the embedding output
    assert torch.equal(hs[0], hf_model.model.embed_tokens.weight[ids].float())
    # hs[L] is the pre-norm output of the last layer (HF's own last entry is normed)
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        assert torch.allclose(hf_model.model.norm(hs[4]), out.hidden_states[-1][0], atol=1e-5)
    assert not torch.allclose(hs[4], out.hidden_states[-1][0])
    for k in range(1, 4):
        assert torch.equal(hs[k], out.hidden_states[k][0])
    # every layer moves the state enough for a wrong-layer capture to stand out
    for k in range(4):
        rel = float((hs[k + 1] - hs[k]).norm() / hs[k + 1].norm())
        assert rel > 0.3, (k, rel)
    # causal: a prefix gives the same rows
    hs3 = hf_reference_hidden_states(hf_model, ids[:3])
    assert torch.allclose(hs3[2], hs[2][:3], atol=1e-5)


def test_expert_weights_land_in_the_right_slots(tiny_target, hf_model):
    """gate/up/down of one routed expert, recomputed from the checkpoint's
    original per-expert tensors, equal what the HF module computes."""
    import torch
    from safetensors.torch import load_file

    t = {k: v.float() for k, v in load_file(str(tiny_target / "model.safetensors")).items()}
    p = "model.layers.2.mlp.experts.3."
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
    want = torch.nn.functional.silu(x @ t[p + "gate_proj.weight"].T) * (x @ t[p + "up_proj.weight"].T)
    want = want @ t[p + "down_proj.weight"].T
    experts = hf_model.model.layers[2].mlp.experts
    with torch.no_grad():
        if hasattr(experts, "gate_up_proj"):  # transformers >= 5: packed 3-D experts
            idx = torch.full((5, 1), 3, dtype=torch.long)
            got = experts(x, idx, torch.ones(5, 1))
        else:  # one module per expert
            got = experts[3](x)
    assert torch.allclose(got, want, atol=1e-5)
