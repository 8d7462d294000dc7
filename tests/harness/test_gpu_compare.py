import pytest

from patchcraft.harness import gpu_compare as cmp


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _hs(torch, n_layers=4, T=12, H=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, H, generator=g) * (k + 1) for k in range(n_layers + 1)]


def test_expected_hs_indices():
    assert cmp.expected_hs_indices([-1, 2, 30]) == [0, 3, 31]
    assert cmp.expected_hs_indices([2, 30, 58]) == [3, 31, 59]
    with pytest.raises(ValueError):
        cmp.expected_hs_indices([-2, 1, 2])
    with pytest.raises(ValueError):
        cmp.expected_hs_indices([True, 1, 2])


def test_exact_and_bf16_rounded_pass(torch):
    hs = _hs(torch)
    ids = [-1, 1, 2]
    rec = [hs[0], hs[2], hs[3]]
    assert cmp.compare_aux_hidden_states(rec, hs, ids).ok
    rounded = [t.to(torch.bfloat16).float() for t in rec]
    res = cmp.compare_aux_hidden_states(torch.cat(rounded, -1), hs, ids)  # concatenated form
    assert res.ok, res.message
    assert res.first_mismatch is None and res.num_tokens == 12


def test_perturbed_entry_fails_and_is_named(torch):
    hs = _hs(torch)
    ids = [-1, 1, 2]
    rec = [hs[0].clone(), hs[2].clone(), hs[3].clone()]
    rec[1] += 0.2 * hs[2].abs().mean() * torch.randn_like(rec[1]) * 3
    res = cmp.compare_aux_hidden_states(rec, hs, ids)
    assert not res.ok
    assert res.first_mismatch == 1
    assert "entry 1 (layer id 1)" in res.message and "hs[2]" in res.message


def test_off_by_one_reports_closest_layer(torch):
    hs = _hs(torch)
    # what an un-cloned embedding turns into: the residual after layer 0
    res = cmp.compare_aux_hidden_states([hs[1], hs[2], hs[3]], hs, [-1, 1, 2])
    assert not res.ok and res.first_mismatch == 0
    assert res.entries[0].closest_hs == 1
    assert "closest reference is hs[1]" in res.message


def test_wrong_entry_count_and_nan_fail(torch):
    hs = _hs(torch)
    assert not cmp.compare_aux_hidden_states([hs[2], hs[3]], hs, [-1, 1, 2]).ok
    bad = [hs[0].clone(), hs[2], hs[3]]
    bad[0][3, 4] = float("nan")
    res = cmp.compare_aux_hidden_states(bad, hs, [-1, 1, 2])
    assert not res.ok and "NaN" in res.message
    with pytest.raises(ValueError):
        cmp.compare_aux_hidden_states([hs[0]] * 3, hs, [-1, 1, 9])  # no hs[10]


def test_isolated_token_tolerated_but_many_tokens_not(torch):
    hs = _hs(torch, T=40)
    ids = [-1, 1, 2]
    rec = [hs[0].clone(), hs[2].clone(), hs[3].clone()]
    rec[2][5] *= 1.05  # one token off by 5 % (e.g. a routing tie flipped)
    rec[2][6] *= 1.08
    res = cmp.compare_aux_hidden_states(rec, hs, ids)
    assert res.ok, res.message
    assert res.entries[2].good_fraction < 1.0
    rec[2][:10] *= 1.3  # a quarter of the tokens: systematic
    assert not cmp.compare_aux_hidden_states(rec, hs, ids).ok


def test_embedding_entry_check(torch):
    emb = torch.randn(50, 8)
    ids = [3, 7, 7, 1]
    good = emb[ids].to(torch.bfloat16).float()
    assert cmp.compare_embedding_entry(good, emb, ids).ok
    assert not cmp.compare_embedding_entry(emb[[3, 7, 7, 2]], emb, ids).ok


def test_token_ids_lossless():
    base = [[1, 2, 3], [4, 5]]
    ok = cmp.compare_token_ids([[1, 2, 3], [4, 5]], base)
    assert ok.ok and ok.num_tokens_compared == 5
    bad = cmp.compare_token_ids([[1, 2, 3], [4, 6]], base)
    assert not bad.ok and bad.first_divergence == {"prompt": 1, "position": 1}
    assert not cmp.compare_token_ids([[1, 2, 3], [4]], base).ok
    assert not cmp.compare_token_ids([[1, 2, 3]], base).ok


def test_summarize_speculation():
    s = cmp.summarize_speculation(
        [{"completion_tokens": 24, "spec_verify_ct": 8}, {"completion_tokens": 24, "spec_verify_ct": 16}], 2.0
    )
    assert s["accept_length"] == 2.0 and s["tokens_per_s"] == 24.0 and s["verify_steps"] == 24
    b = cmp.summarize_speculation([{"completion_tokens": 10}], 0.5)
    assert b["accept_length"] is None and b["tokens_per_s"] == 20.0


# ------------------------------------------------- margin-aware lossless check

# Baseline meta_info in the shape SGLang 0.5.10's Engine.generate returns with
# return_logprob=True, top_logprobs_num=2 and skip_tokenizer_init (so text is
# None), after the worker's JSON round trip: per output token, the top two
# (logprob, token_id, text).  The values are written for the test, not taken
# from a GPU run.  Prompt 0: clear choices, then a near tie at token 3 (margin
# 0.03).  Prompt 1: clear choices throughout.
BASE_OUT = [[11, 12, 13, 14, 15, 16], [21, 22, 23, 24]]
BASE_META = [
    {
        "completion_tokens": 6,
        "output_top_logprobs": [
            [[-0.21, 11, None], [-2.35, 40, None]],
            [[-0.48, 12, None], [-1.52, 41, None]],
            [[-0.90, 13, None], [-1.30, 42, None]],
            [[-0.72, 14, None], [-0.75, 43, None]],  # near tie: 14 vs 43
            [[-0.10, 15, None], [-3.10, 44, None]],
            [[-0.33, 16, None], [-1.90, 45, None]],
        ],
    },
    {
        "completion_tokens": 4,
        "output_top_logprobs": [
            [[-0.05, 21, None], [-3.60, 50, None]],
            [[-0.62, 22, None], [-1.12, 51, None]],
            [[-0.41, 23, None], [-1.77, 52, None]],
            [[-0.26, 24, None], [-2.01, 53, None]],
        ],
    },
]


def _margins(metas=BASE_META):
    return [cmp.top2_margins(m) for m in metas]


def test_top2_margins_from_recorded_meta_info():
    m = _margins()
    assert [round(x, 6) for x in m[0]] == [2.14, 1.04, 0.4, 0.03, 3.0, 1.57]
    assert [round(x, 6) for x in m[1]] == [3.55, 0.5, 1.36, 1.75]
    # tuples (before JSON) and unsorted candidates give the same margin
    assert cmp.top2_margins({"output_top_logprobs": [[(-1.5, 7, None), (-0.5, 8, None)]]}) == [1.0]
    assert cmp.top2_margins({"completion_tokens": 3}) is None  # no logprobs returned
    assert cmp.top2_margins({"output_top_logprobs": [None, [[-0.1, 1, None]]]}) == [None, None]


def test_near_tie_flip_does_not_fail():
    # the speculative run (verify, M=4) took the runner-up at the near tie, then went its own way
    spec = [[11, 12, 13, 43, 60, 61], [21, 22, 23, 24]]
    res = cmp.compare_token_ids(spec, BASE_OUT, _margins())
    assert res.ok, res.message
    assert res.mode == "margin" and res.tie_margin == cmp.DEFAULT_TIE_MARGIN
    assert res.num_tokens_compared == 3 + 4 and res.num_tokens_total == 10
    assert res.near_ties == [{"prompt": 0, "position": 3, "margin": pytest.approx(0.03)}]
    assert res.info == [
        "prompt 0: near tie at token 3 (margin 0.03 < 0.25); not compared from there: the outputs differ from token 3 on"
    ]
    assert "7 of 10 tokens compared" in res.message
    # the same data compared exactly (the old check) fails falsely
    assert not cmp.compare_token_ids(spec, BASE_OUT).ok


def test_clear_margin_divergence_fails():
    spec = [[11, 12, 13, 14, 15, 16], [21, 51, 23, 24]]  # token 1 of prompt 1: margin 0.5
    res = cmp.compare_token_ids(spec, BASE_OUT, _margins())
    assert not res.ok
    assert res.first_divergence == {"prompt": 1, "position": 1}
    assert "diverges at token 1 (spec 51 vs baseline 22; baseline top-2 margin 0.5 >= 0.25" in res.message
    # before the near tie of prompt 0, a divergence fails as well
    spec0 = [[11, 12, 42, 14, 15, 16], [21, 22, 23, 24]]
    res0 = cmp.compare_token_ids(spec0, BASE_OUT, _margins())
    assert not res0.ok and res0.first_divergence == {"prompt": 0, "position": 2}
    # a stricter threshold ungates token 1 of prompt 1 (margin 0.5): then it is info only
    assert cmp.compare_token_ids(spec, BASE_OUT, _margins(), tie_margin=0.6).ok


def test_unknown_margin_stops_gating_and_lengths_still_count():
    metas = [
        dict(BASE_META[0]),
        {"completion_tokens": 4, "output_top_logprobs": BASE_META[1]["output_top_logprobs"][:2]},
    ]
    margins = _margins(metas)  # prompt 1: margins for 2 of its 4 tokens only
    res = cmp.compare_token_ids([BASE_OUT[0], [21, 22, 99, 98]], BASE_OUT, margins)
    assert res.ok and res.near_ties[-1] == {"prompt": 1, "position": 2, "margin": None}
    assert "margin unknown" in res.info[-1]
    # a prompt without margins is compared exactly
    assert not cmp.compare_token_ids([BASE_OUT[0], [21, 22, 99, 98]], BASE_OUT, [margins[0], None]).ok
    # different lengths fail whatever the margins (the smoke ignores EOS)
    short = cmp.compare_token_ids([BASE_OUT[0][:3], BASE_OUT[1]], BASE_OUT, _margins())
    assert not short.ok and "has 3 tokens, baseline 6" in short.message
    assert not cmp.compare_token_ids(BASE_OUT, BASE_OUT, _margins()[:1]).ok
