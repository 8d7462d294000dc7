"""The DeepSeek-V4 case's pure logic: its target, the engine's own states picked and checked (no vLLM needed)."""

from __future__ import annotations

import pytest

from patchcraft.base.errors import PatchcraftError
from patchcraft.real_engine import check
from patchcraft.real_engine.inenv import vllm_dsv4

torch = pytest.importorskip("torch")


def _forward(rows: int, layers: int, scale: float = 1.0) -> dict:
    g = torch.Generator().manual_seed(rows)
    states = [torch.randn(rows, 4, generator=g) * scale for _ in range(layers + 1)]
    return {"embed": states[0], "layers": states[1:], "aux_ptrs": [11, 12], "embed_ptr": 10}


def test_the_target_is_sliding_window_only_with_hc_streams() -> None:
    config = vllm_dsv4.target_config(6)
    assert config["compress_ratios"] == [0] * 6 and config["hc_mult"] == 4 and config["head_dim"] == 512
    assert vllm_dsv4.engine_kwargs(6)["kv_cache_dtype_skip_layers"] == ["6"]


def test_the_states_come_from_the_prefill_forward_with_every_layer() -> None:
    warmup, prefill, decode = _forward(64, 6), _forward(13, 6), _forward(2, 6)
    states, id0 = vllm_dsv4.engine_states([warmup, prefill, decode], 8, 13, 6)
    assert len(states) == 7 and states[0] is prefill["embed"] and states[6] is prefill["layers"][5]
    assert id0 == {"aux_entries": 2, "an_entry_shares_the_embedding": False}
    assert vllm_dsv4.engine_states([_forward(13, 5)], 8, 13, 6) == ([], {})  # a layer missing: nothing


def test_an_entry_sharing_the_embedding_is_said() -> None:
    forward = _forward(13, 6) | {"aux_ptrs": [10, 12]}
    assert vllm_dsv4.engine_states([forward], 8, 13, 6)[1]["an_entry_shares_the_embedding"] is True


def test_states_too_close_to_tell_apart_fail_the_check() -> None:
    states = [torch.randn(8, 4, generator=torch.Generator().manual_seed(k)) for k in range(4)]
    assert vllm_dsv4.check_distinct(states, 8) == []
    states[2] = states[1] * (1 + 1e-4)  # broken: two layers' outputs (nearly) equal
    assert vllm_dsv4.check_distinct(states, 8) == [
        f"hs[1] and hs[2] differ by {float((states[1] - states[2]).abs().max() / states[2].abs().max()):.2g} "
        "(relative): too close to tell apart"
    ]


@pytest.mark.parametrize(
    "changes",
    [{"server": True}, {"norm": "inplace"}, {"compilation": "compiled"}, {"target_dir": "/t"}, {"release": "0.31.0"}],
)
def test_the_stand_in_case_refuses_what_it_does_not_run(changes: dict) -> None:
    fields = {"engine": "vllm", "release": "0.32.0", "model": "DeepseekV4ForCausalLM", "layer_ids": (0, 2, 4)}
    case = check.Case(**(fields | changes))
    with pytest.raises(PatchcraftError, match="DeepseekV4ForCausalLM"):
        check._check_standin_case(case, case.family)
    check._check_standin_case(check.Case(**fields), "deepseek_v4")  # the plain case passes
