import pytest

from patchcraft.gpu_smoke import compare as cmp

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
