import json

import pytest

from patchcraft.gpu_smoke.checkpoint import tiny_deepseek_v3_config
from patchcraft.gpu_smoke.draft_builder import (
    draft_tensor_specs,
    eagle3_draft_config,
    simulate_sglang_eagle3_load,
)
from patchcraft.gpu_smoke.wheels import source_reader


def test_draft_config_format():
    tcfg = tiny_deepseek_v3_config(tp_size=8)
    cfg = eagle3_draft_config(tcfg, [-1, 1, 2], tp_size=8)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 1, 2]
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    assert cfg["num_hidden_layers"] == 1
    assert cfg["target_hidden_size"] == cfg["hidden_size"] == 512
    assert cfg["draft_vocab_size"] == cfg["vocab_size"] == 1024
    assert cfg["num_attention_heads"] % 8 == 0
    specs = draft_tensor_specs(cfg)
    assert specs["fc.weight"][0] == (512, 3 * 512)  # fc input = hidden_size x 3
    assert specs["midlayer.self_attn.q_proj.weight"][0][1] == 2 * 512  # [embeds, hidden]


@pytest.mark.parametrize("ids", [[-1, 1], [-1, 1, 2, 3], [-2, 1, 2], [-1, 1, 4]])
def test_draft_config_rejects_bad_ids(ids):
    with pytest.raises(ValueError):
        eagle3_draft_config(tiny_deepseek_v3_config(), ids)  # 4 layers


def test_written_draft(tmp_path, tiny_target):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from patchcraft.gpu_smoke.draft_builder import draft_layer_ids, make_tiny_eagle3_draft

    d = make_tiny_eagle3_draft(tmp_path / "draft", tiny_target, [-1, 1, 2], tp_size=2)
    cfg = json.loads((d / "config.json").read_text())
    assert draft_layer_ids(d) == [-1, 1, 2]
    t = load_file(str(d / "model.safetensors"))
    assert set(t) == set(draft_tensor_specs(cfg))
    assert t["fc.weight"].shape == (128, 384) and t["fc.weight"].dtype == torch.bfloat16
    assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool
    assert (t["d2t"] + torch.arange(t["d2t"].shape[0])).tolist() == list(range(256))  # identity map
    again = load_file(
        str(make_tiny_eagle3_draft(tmp_path / "d2", tiny_target, [-1, 1, 2], tp_size=2) / "model.safetensors")
    )
    assert all(torch.equal(t[k], again[k]) for k in t)


def test_weight_names_load_in_sglang_release(sglang_wheel):
    src = source_reader(sglang_wheel)("sglang/srt/models/llama_eagle3.py")
    assert src is not None
    cfg = eagle3_draft_config(tiny_deepseek_v3_config(), [-1, 1, 2])
    names = list(draft_tensor_specs(cfg))
    r = simulate_sglang_eagle3_load(names, src)
    assert r["unmatched"] == [] and r["params_not_loaded"] == []
    assert sorted(r["ignored"]) == ["d2t", "t2d"]
    qkv = next(k for k in r["loaded"] if k.endswith("qkv_proj.weight"))
    assert len(r["loaded"][qkv]) == 3
    # the release's fc really takes three target hidden states
    assert "hidden_size_in * 3" in src or "hidden_size_in * self.num_aux_hidden_states" in src

    # mutation: a misspelt weight is silently dropped by SGLang -> must be reported
    bad = [n.replace("hidden_norm", "hiddennorm") for n in names]
    r = simulate_sglang_eagle3_load(bad, src)
    assert r["unmatched"] == ["midlayer.hiddennorm.weight"]
    assert any(p.endswith("hidden_norm.weight") for p in r["params_not_loaded"])
