"""patchcraft's stand-ins against SGLang's own Triton kernels, on random inputs: ``python sglang_standins_check.py OUT.json``.

Runs in the engine environment with ``TRITON_INTERPRET=1`` (Triton's CPU
interpreter). For each stand-in whose GPU call site launches a Triton
kernel the release ships, both run on the same random inputs and their
outputs are compared exactly. ``copy_all_layer_kv_cache_cpu`` is left out:
its kernel takes raw buffer addresses, which the interpreter cannot load.
Writes ``{op: {"ok": bool, "cases": n, "detail": ...}}``; exit 0 when written.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

os.environ["TRITON_INTERPRET"] = "1"
os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # the GPU call sites' kernels, not the CPU branch
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from sglang_standins import absent, install, ops  # noqa: E402

absent.install(("torchvision",))
install()


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check_bonus(g: torch.Generator) -> None:
    from sglang.kernels.ops.speculative import eagle

    bs, stride = 5, 4
    tokens = torch.randint(0, 1000, (bs, stride), generator=g)
    lens = torch.randint(1, stride + 1, (bs,), generator=g)
    a, b = torch.zeros(bs, dtype=torch.int64), torch.zeros(bs, dtype=torch.int64)
    eagle.fill_bonus_tokens[(bs,)](tokens, lens, a, stride)
    ops.fill_bonus_tokens_cpu(tokens, lens, b, stride)
    assert torch.equal(a, b), (a, b)


def check_accept_loc(g: torch.Generator) -> None:
    from sglang.kernels.ops.speculative import eagle

    locs = torch.randint(0, 1000, (12,), generator=g)
    index = torch.randint(0, 12, (12,), generator=g)
    index[torch.rand(12, generator=g) < 0.4] = -1
    a, b = torch.full((12,), -5, dtype=torch.int64), torch.full((12,), -5, dtype=torch.int64)
    eagle.fill_accept_out_cache_loc[(12,)](index, locs, a, _pow2(12))
    ops.fill_accept_out_cache_loc_cpu(index, locs, b)
    assert torch.equal(a, b), (a, b)


def _spans(g: torch.Generator, bs: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    start = torch.randint(0, width // 2, (bs,), generator=g)
    return start, start + torch.randint(0, width // 2, (bs,), generator=g)


def check_extend_locs(g: torch.Generator) -> None:
    from sglang.kernels.ops.speculative import cache_locs

    pool = torch.randint(0, 10_000, (6, 64), generator=g, dtype=torch.int32)
    rows = torch.randint(0, 6, (4,), generator=g)
    start, end = _spans(g, 4, 64)
    n = int((end - start).sum())
    a, b = torch.full((n,), -1, dtype=torch.int64), torch.full((n,), -1, dtype=torch.int64)
    cache_locs.assign_extend_cache_locs[(4,)](rows, pool, start, end, a, pool.shape[1], _pow2(4))
    ops.assign_extend_cache_locs_cpu(rows, pool, start, end, b, pool.shape[1])
    assert torch.equal(a, b), (a, b)


def check_draft_locs(g: torch.Generator) -> None:
    from sglang.kernels.ops.speculative import cache_locs

    topk, steps = 2, 3
    pool = torch.randint(0, 10_000, (6, 64), generator=g, dtype=torch.int32)
    rows = torch.randperm(6, generator=g)[:3]
    seq = torch.randint(0, 64 - topk * steps, (3,), generator=g)
    a, b = (
        torch.full((3 * topk * steps,), -1, dtype=torch.int64),
        torch.full((3 * topk * steps,), -1, dtype=torch.int64),
    )
    cache_locs.assign_draft_cache_locs_contiguous[(3,)](rows, pool, seq, a, pool.shape[1], topk, steps, BS=3)
    ops.assign_draft_cache_locs_contiguous_cpu(rows, pool, seq, b, pool.shape[1], topk, steps)
    assert torch.equal(a, b), (a, b)


def check_req_to_token(g: torch.Generator) -> None:
    from sglang.kernels.ops.memory import common

    kernel = getattr(common, "assign_req_to_token_pool", None)
    if kernel is None:
        from sglang.srt.mem_cache import allocation

        kernel = allocation.assign_req_to_token_pool
    pool_a = torch.randint(0, 10_000, (6, 64), generator=g, dtype=torch.int32)
    pool_b = pool_a.clone()
    rows = torch.randperm(6, generator=g)[:4]
    start, end = _spans(g, 4, 64)
    locs = torch.randint(0, 10_000, (int((end - start).sum()),), generator=g)
    kernel[(4,)](rows, pool_a, start, end, locs, pool_a.shape[1], _pow2(4))
    ops.assign_req_to_token_pool_cpu(rows, pool_b, start, end, locs, pool_b.shape[1])
    assert torch.equal(pool_a, pool_b)


def _tree_inputs(g: torch.Generator, bs: int, topk: int, depth: int, n: int) -> dict[str, Any]:
    parents, selecteds = [], []
    for _ in range(bs):
        parent_list = [-1] + list(range(topk * (depth - 1)))
        candidates = list(range(topk)) + [topk + i for i in range(topk * topk * (depth - 1))]
        selected: list[int] = []
        while len(selected) < n - 1:
            ok = [c for c in candidates if c not in selected and (c < topk or parent_list[c // topk] in selected)]
            selected.append(ok[int(torch.randint(0, len(ok), (1,), generator=g))])
        parents.append(parent_list)
        selecteds.append(sorted(selected))
    return {
        "parent": torch.tensor(parents, dtype=torch.int64),
        "selected": torch.tensor(selecteds, dtype=torch.int64),
        "seq": torch.randint(1, 9, (bs,), generator=g),
    }


def _build(fn: Callable[..., Any], t: dict[str, Any], bs: int, topk: int, depth: int, n: int, mode: int) -> list[Any]:
    size = int(t["seq"].sum()) * n + n * n * bs if mode == 0 else n * n * bs
    outs = [
        torch.ones(size, dtype=torch.bool),
        torch.zeros(bs * n, dtype=torch.int64),
        torch.full((bs, n), -1, dtype=torch.int64),
        torch.full((bs, n), -1, dtype=torch.int64),
        torch.full((bs, n), -1, dtype=torch.int64),
    ]
    fn(t["parent"], t["selected"], t["seq"], *outs, topk, depth, n, mode)
    return outs


def check_build_tree(g: torch.Generator) -> None:
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode, sgl_build_tree_kernel_triton

    def triton(*args: Any) -> None:
        *head, mode = args
        sgl_build_tree_kernel_triton(*head, tree_mask_mode=TreeMaskMode(mode))

    for topk, depth, n in ((1, 1, 2), (1, 3, 4), (2, 3, 5), (4, 3, 8)):
        for mode in (0, 1):
            t = _tree_inputs(g, 3, topk, depth, n)
            a = _build(triton, t, 3, topk, depth, n, mode)
            b = _build(ops.build_tree_kernel_efficient_cpu, t, 3, topk, depth, n, mode)
            for x, y in zip(a, b):
                assert torch.equal(x, y), (topk, depth, n, mode, x, y)


def check_verify(g: torch.Generator) -> None:
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    for topk, depth, n in ((1, 1, 2), (1, 3, 4), (2, 3, 5), (4, 3, 8)):
        bs = 3
        t = _tree_inputs(g, bs, topk, depth, n)
        _, _, r_index, r_next, r_sibling = _build(ops.build_tree_kernel_efficient_cpu, t, bs, topk, depth, n, 1)
        candidates = torch.randint(0, 4, (bs, n), generator=g)
        target = torch.randint(0, 4, (bs, n), generator=g)
        results = []
        for run in ("triton", "standin"):
            predicts = torch.full((bs * n,), -1, dtype=torch.int64)
            accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int64)
            accept_num = torch.zeros(bs, dtype=torch.int64)
            if run == "triton":
                verify_tree_greedy_triton(
                    predicts, accept_index, accept_num, candidates, r_index, r_next, r_sibling, target
                )
            else:
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
            results.append((predicts, accept_index, accept_num))
        for x, y in zip(*results):
            assert torch.equal(x, y), (topk, depth, n, x, y)


CHECKS = {
    "fill_bonus_tokens_cpu": check_bonus,
    "fill_accept_out_cache_loc_cpu": check_accept_loc,
    "assign_extend_cache_locs_cpu": check_extend_locs,
    "assign_draft_cache_locs_contiguous_cpu": check_draft_locs,
    "assign_req_to_token_pool_cpu": check_req_to_token,
    "build_tree_kernel_efficient_cpu": check_build_tree,
    "verify_tree_greedy_cpu": check_verify,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: sglang_standins_check.py OUT.json", file=sys.stderr)
        return 2
    report: dict[str, Any] = {}
    for name, check in CHECKS.items():
        cases = 3
        try:
            for seed in range(cases):
                check(torch.Generator().manual_seed(seed))
            report[name] = {"ok": True, "cases": cases, "detail": "equal to SGLang's Triton kernel"}
        except AssertionError as exc:
            report[name] = {"ok": False, "cases": cases, "detail": f"mismatch: {str(exc)[:500]}"}
        except Exception as exc:
            report[name] = {"ok": False, "cases": cases, "detail": traceback.format_exception_only(exc)[-1].strip()}
    report["copy_all_layer_kv_cache_cpu"] = {"ok": None, "cases": 0, "detail": "not compared (raw addresses)"}
    Path(argv[1]).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
