"""patchcraft's stand-ins for SGLang's 8 CPU ``sgl_kernel`` ops, each against a reference on random inputs.

The references are written differently from the stand-ins (whole-tensor
indexing where the stand-ins loop; the tree read as parent links where the
stand-ins follow the kernel's index arithmetic), plus hand-worked trees.
No SGLang needed: the stand-ins are pure torch. The engine tier checks the
two tree ops against SGLang's own Triton kernels too (test_sglang_engine.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

INENV = Path(__file__).resolve().parents[2] / "patchcraft" / "real_engine" / "inenv"
sys.path.insert(0, str(INENV))
from sglang_standins import install, ops

SEEDS = range(5)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8])
def test_copy_all_layer_kv_cache(seed, dtype):
    g = _gen(seed)
    slots, layers = 40, 3
    buffers = [(torch.randn(slots, 2, 8, generator=g) * 50).to(dtype) for _ in range(layers)]
    before = [b.clone() for b in buffers]
    perm = torch.randperm(slots, generator=g)
    src, tgt = perm[:7], perm[5:12]  # overlapping sets: every row read before any is written
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for got, old in zip(buffers, before):
        want = old.clone()
        want[tgt] = old[src]
        assert torch.equal(got, want)


def _pool(g, rows=6, width=32):
    return torch.randint(0, 10_000, (rows, width), generator=g, dtype=torch.int32)


def _spans(g, batch, width):
    start = torch.randint(0, width // 2, (batch,), generator=g)
    end = start + torch.randint(0, width // 2, (batch,), generator=g)
    return start, end


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_req_to_token_pool(seed):
    g = _gen(seed)
    pool = _pool(g)
    rows = torch.randperm(pool.shape[0], generator=g)[:4]
    start, end = _spans(g, 4, pool.shape[1])
    locs = torch.randint(0, 10_000, (int((end - start).sum()),), generator=g)
    want = pool.clone()
    pieces = torch.split(locs, (end - start).tolist())
    for row, s, e, piece in zip(rows.tolist(), start.tolist(), end.tolist(), pieces):
        want[row, s:e] = piece.to(torch.int32)
    ops.assign_req_to_token_pool_cpu(rows, pool, start, end, locs, pool.shape[1])
    assert torch.equal(pool, want)


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_extend_cache_locs(seed):
    g = _gen(seed)
    pool = _pool(g)
    rows = torch.randint(0, pool.shape[0], (5,), generator=g)
    start, end = _spans(g, 5, pool.shape[1])
    want = torch.cat([pool[r, s:e] for r, s, e in zip(rows.tolist(), start.tolist(), end.tolist())]).long()
    out = torch.full((int((end - start).sum()),), -7, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rows, pool, start, end, out, pool.shape[1])
    assert torch.equal(out, want)


def test_assign_req_and_extend_are_inverse():
    g = _gen(11)
    pool = torch.zeros(4, 16, dtype=torch.int64)
    rows, start, end = torch.tensor([2, 0]), torch.tensor([3, 0]), torch.tensor([9, 4])
    locs = torch.randint(0, 999, (10,), generator=g)
    ops.assign_req_to_token_pool_cpu(rows, pool, start, end, locs, 16)
    back = torch.empty(10, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rows, pool, start, end, back, 16)
    assert torch.equal(back, locs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("topk,steps", [(1, 1), (1, 3), (4, 2)])
def test_assign_draft_cache_locs_contiguous(seed, topk, steps):
    g = _gen(seed)
    pool = _pool(g, width=40)
    rows = torch.randperm(pool.shape[0], generator=g)[:3]
    seq_lens = torch.randint(0, 40 - topk * steps, (3,), generator=g)
    out = torch.full((3 * topk * steps,), -1, dtype=torch.int64)
    ops.assign_draft_cache_locs_contiguous_cpu(rows, pool, seq_lens, out, pool.shape[1], topk, steps)
    idx = seq_lens[:, None] + torch.arange(topk * steps)[None, :]
    want = pool[rows[:, None], idx].reshape(-1).long()
    assert torch.equal(out, want)


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_bonus_tokens(seed):
    g = _gen(seed)
    batch, stride = 5, 4
    tokens = torch.randint(0, 1000, (batch, stride), generator=g)
    lens = torch.randint(1, stride + 1, (batch,), generator=g)
    bonus = torch.zeros(batch, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(tokens, lens, bonus, stride)
    assert torch.equal(bonus, tokens.gather(1, (lens - 1)[:, None])[:, 0])


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_accept_out_cache_loc(seed):
    g = _gen(seed)
    locs = torch.randint(0, 1000, (12,), generator=g)
    index = torch.randint(0, 12, (3, 4), generator=g)
    index[torch.rand(3, 4, generator=g) < 0.4] = -1
    out = torch.full((12,), -5, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(index.reshape(-1), locs, out)
    kept = index.reshape(-1)[index.reshape(-1) != -1]
    assert torch.equal(out[: kept.numel()], locs[kept])
    assert (out[kept.numel() :] == -5).all()


# ---- the draft tree ----------------------------------------------------------


def _random_tree(g, topk, depth, n):
    """SGLang's draft tree inputs for one request: parent_list and selected_index as the
    EAGLE worker's ``organize_draft_results`` builds them (token t of step s has index
    ``1 + topk * s + ...``; its parent is a token of step s-1)."""
    # parent_list[k]: the token index at tree-block k (block 0 is the root)
    parent_list = [-1] + [i for i in range(topk * (depth - 1))]
    # candidate tokens: step 0 -> children of the root; step s -> children of a step s-1 token
    candidates = list(range(topk)) + [topk + i for i in range(topk * topk * (depth - 1))]
    selected: list[int] = []
    while len(selected) < n - 1:
        eligible = [c for c in candidates if c not in selected and (c < topk or parent_list[c // topk] in selected)]
        if not eligible:
            break
        selected.append(eligible[int(torch.randint(0, len(eligible), (1,), generator=g))])
    selected.sort()  # SGLang sorts the selected indices; a parent's index is below its children's
    return parent_list, selected


def _tree_reference(parent_list, selected, topk, seq_len, n):
    """Mask rows (n x n), positions and child/sibling lists read as parent links."""

    def parent_position(p):  # 0-based position in selected of p's parent, or -1 for the root
        tb = selected[p] // topk
        if tb == 0:
            return -1
        token = parent_list[tb]
        return selected.index(token) if token in selected else None

    mask = torch.zeros(n, n, dtype=torch.bool)
    positions = [seq_len]
    mask[0, 0] = True
    for x in range(1, n):
        mask[x, 0] = True
        p, depth = x - 1, 0
        while p is not None and p >= 0:
            mask[x, p + 1] = True
            depth += 1
            p = parent_position(p)
        positions.append(seq_len + depth)
    children = {i: [] for i in range(n)}
    for x in range(1, n):
        p = parent_position(x - 1)
        if p is not None:
            children[p + 1].append(x)
    return mask, positions, children


def _run_build(parent_lists, selecteds, seq_lens, topk, depth, n, mode):
    b = len(seq_lens)
    parent = torch.tensor(parent_lists, dtype=torch.int64)
    selected = torch.tensor(selecteds, dtype=torch.int64)
    seq = torch.tensor(seq_lens, dtype=torch.int64)
    size = (int(seq.sum()) * n + n * n * b) if mode == 0 else n * n * b
    mask = torch.ones(size, dtype=torch.bool)
    positions = torch.empty(b * n, dtype=torch.int64)
    r_index = torch.full((b, n), -1, dtype=torch.int64)
    r_next = torch.full((b, n), -1, dtype=torch.int64)
    r_sibling = torch.full((b, n), -1, dtype=torch.int64)
    ops.build_tree_kernel_efficient_cpu(
        parent, selected, seq, mask, positions, r_index, r_next, r_sibling, topk, depth, n, mode
    )
    return mask, positions, r_index, r_next, r_sibling


def _children_from_links(r_next, r_sibling, node):
    out, cur = [], int(r_next[node])
    while cur != -1:
        out.append(cur)
        cur = int(r_sibling[cur])
    return sorted(out)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("topk,depth,n", [(1, 1, 2), (1, 3, 4), (2, 3, 5), (4, 3, 8)])
@pytest.mark.parametrize("mode", [0, 1])
def test_build_tree_kernel_efficient(seed, topk, depth, n, mode):
    g = _gen(seed)
    seq_lens = torch.randint(1, 9, (3,), generator=g).tolist()
    trees = [_random_tree(g, topk, depth, n) for _ in seq_lens]
    parents = [t[0] for t in trees]
    width = max(len(p) for p in parents)
    parents = [p + [0] * (width - len(p)) for p in parents]
    selecteds = [t[1] + [0] * (n - 1 - len(t[1])) for t in trees]
    if any(len(t[1]) != n - 1 for t in trees):
        pytest.skip("tree too small for n draft tokens")
    mask, positions, r_index, r_next, r_sibling = _run_build(parents, selecteds, seq_lens, topk, depth, n, mode)
    offset = 0
    for b, seq_len in enumerate(seq_lens):
        want_mask, want_pos, children = _tree_reference(parents[b], selecteds[b], topk, seq_len, n)
        if mode == 0:
            rows = mask[offset : offset + n * (seq_len + n)].view(n, seq_len + n)
            assert rows[:, :seq_len].all()  # the verified prefix is left as allocated (all visible)
            got = rows[:, seq_len:]
            offset += n * (seq_len + n)
        else:
            got = mask[b * n * n : (b + 1) * n * n].view(n, n)
        assert torch.equal(got, want_mask)
        assert positions[b * n : (b + 1) * n].tolist() == want_pos
        assert r_index[b].tolist() == [b * n + i for i in range(n)]
        for node in range(n):
            assert _children_from_links(r_next[b], r_sibling[b], node) == children[node]


def test_build_tree_chain_by_hand():
    # topk 1, 2 steps, 3 draft tokens: root -> d1 -> d2; seq_len 5
    mask, positions, r_index, r_next, r_sibling = _run_build([[-1, 0]], [[0, 1]], [5], 1, 2, 3, 1)
    assert mask.view(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert positions.tolist() == [5, 6, 7]
    assert r_next.tolist() == [[1, 2, -1]] and r_sibling.tolist() == [[-1, -1, -1]]


def _verify_reference(candidates, r_index, children, target, steps):
    """Greedy walk: at each level the first child (in sibling order) whose token equals
    the target's prediction at the last accepted node."""
    last, path, node = int(r_index[0]), [int(r_index[0])], 0
    for _ in range(1, steps):
        want = int(target[last])
        nxt = next((c for c in children[node] if int(candidates[c]) == want), None)
        if nxt is None:
            break
        node, last = nxt, int(r_index[nxt])
        path.append(last)
    return path


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("topk,depth,n", [(1, 1, 2), (1, 3, 4), (2, 3, 5), (4, 3, 8)])
def test_verify_tree_greedy(seed, topk, depth, n):
    g = _gen(seed)
    batch, vocab = 3, 4  # a small vocabulary, so drafts often match
    trees = [_random_tree(g, topk, depth, n) for _ in range(batch)]
    if any(len(t[1]) != n - 1 for t in trees):
        pytest.skip("tree too small for n draft tokens")
    width = max(len(t[0]) for t in trees)
    parents = [t[0] + [0] * (width - len(t[0])) for t in trees]
    _, _, r_index, r_next, r_sibling = _run_build(parents, [t[1] for t in trees], [4] * batch, topk, depth, n, 1)
    candidates = torch.randint(0, vocab, (batch, n), generator=g)
    target = torch.randint(0, vocab, (batch * n,), generator=g)
    steps = depth + 1
    predicts = torch.full((batch * n,), -1, dtype=torch.int64)
    accept_index = torch.full((batch, steps), -1, dtype=torch.int64)
    accept_num = torch.zeros(batch, dtype=torch.int64)
    ops.verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates,
        retrive_index=r_index,
        retrive_next_token=r_next,
        retrive_next_sibling=r_sibling,
        target_predict=target,
    )
    for b in range(batch):
        children = {i: [] for i in range(n)}
        cur_children = {i: [] for i in range(n)}
        for node in range(n):  # sibling order, as the kernel walks it
            cur, order = int(r_next[b, node]), []
            while cur != -1:
                order.append(cur)
                cur = int(r_sibling[b, cur])
            cur_children[node] = order
        children = cur_children
        path = _verify_reference(candidates[b], r_index[b], children, target, steps)
        assert accept_num[b] == len(path) - 1
        assert accept_index[b, : len(path)].tolist() == path
        assert (accept_index[b, len(path) :] == -1).all()
        for node in path:
            assert predicts[node] == target[node]
        assert (predicts[[i for i in range(b * n, (b + 1) * n) if i not in path]] == -1).all()


def test_install_makes_sgl_kernel(monkeypatch):
    monkeypatch.delitem(sys.modules, "sgl_kernel", raising=False)
    kernels = install()
    import importlib.util

    import sgl_kernel  # type: ignore[import-not-found]

    assert sorted(kernels) == sorted(ops.OPS) and len(kernels) == 8
    assert sgl_kernel.fill_bonus_tokens_cpu is ops.fill_bonus_tokens_cpu
    assert importlib.util.find_spec("sgl_kernel") is not None
    with pytest.raises(AttributeError, match="rotate_input_ids_cpu: patchcraft's CPU stand-ins provide only"):
        sgl_kernel.rotate_input_ids_cpu  # noqa: B018
    from sgl_kernel.kvcacheio import transfer_kv_all_layer  # type: ignore[import-not-found]

    with pytest.raises(RuntimeError, match="sgl_kernel.kvcacheio.transfer_kv_all_layer: a placeholder"):
        transfer_kv_all_layer()
    with pytest.raises(ValueError):
        install("cuda")
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_torchvision_placeholder_imports_and_refuses_calls(monkeypatch):
    from sglang_standins import absent

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    placed = absent.install(("patchcraft_no_such_package",))
    assert placed == ["patchcraft_no_such_package"]
    import importlib

    transforms = importlib.import_module("patchcraft_no_such_package.transforms.functional")
    mode = transforms.InterpolationMode.BICUBIC  # attributes at import time are fine
    with pytest.raises(
        RuntimeError, match="patchcraft_no_such_package.transforms.functional.InterpolationMode.BICUBIC"
    ):
        mode()

    class Derived(transforms.Compose):  # a class deriving from a placeholder derives from object
        pass

    assert Derived.__mro__[1] is object
    assert importlib.import_module("patchcraft_no_such_package").__version__ == absent.VERSION
    assert absent.install(("json",)) == []  # a package that imports for real is left alone
    for name in [m for m in sys.modules if m.startswith("patchcraft_no_such_package")]:
        monkeypatch.delitem(sys.modules, name)
