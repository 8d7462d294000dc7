"""patchcraft's stand-ins for the 8 CPU ops SGLang's CPU path imports from ``sgl_kernel``.

SGLang's CPU backend (``SGLANG_USE_CPU_ENGINE=1``) imports these at module
import time from ``sgl_kernel``, whose CPU build targets Xeon AMX and is
built from source; no installable CPU ``sgl_kernel`` exists. Each function
here does what the Triton kernel SGLang runs on GPUs for the same call site
does (the kernel named in its docstring, in the release's own source), in
small pure torch: the engine's tensors are tiny on a CPU run, so clarity
wins over speed. Every op mutates its output arguments in place and returns
None, as the ``sgl_kernel`` ops do.

Pure torch and stdlib: this file is imported in the engine's environment
(SGLang installed) and in patchcraft's tests (no SGLang).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import torch
from torch import Tensor


def _ints(t: Tensor) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def copy_all_layer_kv_cache_cpu(data_ptrs: Tensor, strides: Tensor, tgt_loc: Tensor, src_loc: Tensor) -> None:
    """Copy each layer's KV rows ``src_loc`` onto ``tgt_loc`` (``copy_all_layer_kv_cache_tiled``,
    ``kernels/ops/kvcache/cache_move.py``).

    ``data_ptrs[i]`` is the address of layer buffer ``i``, ``strides[i]`` its
    bytes per token slot. All rows are read before any is written, so an
    overlap of the two sets copies the old rows (the Triton kernel's "safe for
    in-place copy").
    """
    src = src_loc.reshape(-1).to(torch.long)
    tgt = tgt_loc.reshape(-1).to(torch.long)
    if src.numel() != tgt.numel():
        raise ValueError(f"copy_all_layer_kv_cache_cpu: {src.numel()} source and {tgt.numel()} target slots")
    if src.numel() == 0:
        return
    rows = int(torch.maximum(src.max(), tgt.max()).item()) + 1
    for address, stride in zip(_ints(data_ptrs), _ints(strides)):
        buffer = (ctypes.c_uint8 * (rows * stride)).from_address(address)
        view = torch.frombuffer(buffer, dtype=torch.uint8).view(rows, stride)
        view[tgt] = view[src].clone()


def assign_req_to_token_pool_cpu(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    start_offset: Tensor,
    end_offset: Tensor,
    out_cache_loc: Tensor,
    pool_len: int,
) -> None:
    """Write request ``i``'s new slots into its row of ``req_to_token``, columns
    ``start_offset[i]:end_offset[i]``, taken from ``out_cache_loc`` packed request
    after request (``assign_req_to_token_pool``, ``srt/mem_cache/allocation.py``)."""
    del pool_len  # the row width; req_to_token's own shape says it
    offset = 0
    for row, start, end in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        count = end - start
        if count > 0:
            req_to_token[row, start:end] = out_cache_loc[offset : offset + count].to(req_to_token.dtype)
        offset += max(count, 0)


def assign_extend_cache_locs_cpu(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    start_offset: Tensor,
    end_offset: Tensor,
    out_cache_loc: Tensor,
    pool_len: int,
) -> None:
    """The reverse of :func:`assign_req_to_token_pool_cpu`: gather request ``i``'s
    slots ``start_offset[i]:end_offset[i]`` from its row of ``req_to_token`` into
    ``out_cache_loc``, packed (``assign_extend_cache_locs``,
    ``kernels/ops/speculative/cache_locs.py``)."""
    del pool_len
    offset = 0
    for row, start, end in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        count = end - start
        if count > 0:
            out_cache_loc[offset : offset + count] = req_to_token[row, start:end].to(out_cache_loc.dtype)
        offset += max(count, 0)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    seq_lens: Tensor,
    out_cache_loc: Tensor,
    pool_len: int,
    topk: int,
    speculative_num_steps: int,
) -> None:
    """For request ``i``, copy the ``topk * speculative_num_steps`` slots of its row
    from column ``seq_lens[i]`` on into ``out_cache_loc[i * n : (i + 1) * n]``
    (``assign_draft_cache_locs_contiguous``, ``kernels/ops/speculative/cache_locs.py``)."""
    del pool_len
    width = int(topk) * int(speculative_num_steps)
    for i, (row, start) in enumerate(zip(_ints(req_pool_indices), _ints(seq_lens))):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[row, start : start + width].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens: Tensor, accept_lens: Tensor, bonus_tokens: Tensor, accept_stride: int) -> None:
    """``bonus_tokens[i] = accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]``: each
    request's last accepted token (``fill_bonus_tokens``, ``kernels/ops/speculative/eagle.py``)."""
    flat = accept_tokens.reshape(-1)
    for i, length in enumerate(_ints(accept_lens)):
        bonus_tokens[i] = flat[int(accept_stride) * i + length - 1]


def fill_accept_out_cache_loc_cpu(accept_index: Tensor, out_cache_loc: Tensor, accept_out_cache_loc: Tensor) -> None:
    """Pack ``out_cache_loc[accept_index[j]]`` for every ``accept_index[j] != -1``, in
    order, into ``accept_out_cache_loc`` (``fill_accept_out_cache_loc``,
    ``kernels/ops/speculative/eagle.py``)."""
    dst = 0
    for src in _ints(accept_index):
        if src > -1:
            accept_out_cache_loc[dst] = out_cache_loc[src]
            dst += 1


def _position_of(selected: list[int], n: int, token: int) -> int:
    """The draft position (0-based, into ``selected``) of a token index, or -1."""
    for p in range(n - 1):
        if selected[p] == token:
            return p
    return -1


def build_tree_kernel_efficient_cpu(
    parent_list: Tensor,
    selected_index: Tensor,
    verified_seq_len: Tensor,
    tree_mask: Tensor,
    positions: Tensor,
    retrieve_index: Tensor,
    retrieve_next_token: Tensor,
    retrieve_next_sibling: Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: Any,
) -> None:
    """The EAGLE draft tree: its attention mask, positions and retrieve links
    (``sgl_build_tree_kernel_efficient_triton``, ``kernels/ops/speculative/spec_tree.py``),
    one batch item at a time, statement for statement.

    ``tree_mask_mode`` 0 is FULL_MASK (each draft token's row spans the
    verified prefix and the draft tokens), any other value a per-request
    ``draft_token_num`` square (QLEN_ONLY). The retrieve tensors must come in
    filled with -1, as SGLang allocates them.
    """
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise NotImplementedError(
            f"build_tree_kernel_efficient_cpu: tree_mask_mode {mode} (bit-packed) is not stood in"
        )
    n = int(draft_token_num)
    seq_lens = _ints(verified_seq_len)
    mask = tree_mask.reshape(-1)
    flat_positions = positions.reshape(-1)
    r_index = retrieve_index.reshape(-1)
    r_next = retrieve_next_token.reshape(-1)
    r_sibling = retrieve_next_sibling.reshape(-1)
    parents = parent_list.reshape(parent_list.shape[0], -1) if parent_list.dim() > 1 else parent_list.reshape(1, -1)
    selected = selected_index.reshape(selected_index.shape[0], -1)
    prefix_sum = 0
    for b, seq_len in enumerate(seq_lens):
        sel = _ints(selected[b])
        par = _ints(parents[b] if parent_list.dim() > 1 else parents[0])

        flat_positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            r_index[b * n + i] = b * n + i
            parent_tb = sel[i - 1] // int(topk)
            if parent_tb == 0:
                parent_position = 0
            else:
                found = _position_of(sel, n, par[parent_tb])
                if found < 0:
                    continue
                parent_position = found + 1
            previous = int(r_next[b * n + parent_position])
            r_next[b * n + parent_position] = i
            if previous != -1:
                r_sibling[b * n + i] = previous
        r_index[b * n] = b * n
        seq_tree = n * n * b + prefix_sum * n
        for x in range(n):
            if mode == 0:
                row = seq_tree + (seq_len + n) * x + seq_len + 1
            else:
                row = n * n * b + n * x + 1
            mask[row - 1] = True
            mask[row : row + n - 1] = False
            if x == 0:
                continue
            cur = x - 1
            position = 0
            for _ in range(int(depth)):
                position += 1
                mask[row + cur] = True
                parent_tb = sel[cur] // int(topk)
                if parent_tb == 0:
                    break
                found = _position_of(sel, n, par[parent_tb])
                if found < 0:
                    break
                cur = found
            flat_positions[b * n + x] = position + seq_len
        prefix_sum += seq_len


def verify_tree_greedy_cpu(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    target_predict: Tensor,
) -> None:
    """Greedy verification of the draft tree (``verify_tree_greedy_kernel_triton``,
    ``kernels/ops/speculative/spec_tree.py``): walk from the root, at each level
    take the first child (then its siblings) whose draft token equals the
    target's prediction at the last accepted node; write the accepted path,
    its length, and the target's tokens into ``predicts``.

    The keyword names keep sgl_kernel's ``retrive_*`` spelling: SGLang calls
    the op with them.
    """
    batch, n = candidates.shape[0], candidates.shape[1]
    steps = accept_index.shape[1]
    index = retrive_index.reshape(batch, n)
    next_token = retrive_next_token.reshape(batch, n)
    next_sibling = retrive_next_sibling.reshape(batch, n)
    target = target_predict.reshape(-1)
    for b in range(batch):
        last = int(index[b, 0])
        accept_index[b, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, steps):
            cur = int(next_token[b, cur])
            want = int(target[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == want:
                    predicts.reshape(-1)[last] = want
                    accepted += 1
                    last = int(index[b, cur])
                    accept_index[b, accepted] = last
                    matched = True
                    break
                cur = int(next_sibling[b, cur])
            if not matched:
                break
        accept_token_num[b] = accepted
        predicts.reshape(-1)[last] = target[last]


#: The ops, by the name ``sgl_kernel`` exports them under.
OPS: dict[str, Callable[..., None]] = {
    "copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache_cpu,
    "assign_req_to_token_pool_cpu": assign_req_to_token_pool_cpu,
    "assign_extend_cache_locs_cpu": assign_extend_cache_locs_cpu,
    "assign_draft_cache_locs_contiguous_cpu": assign_draft_cache_locs_contiguous_cpu,
    "fill_bonus_tokens_cpu": fill_bonus_tokens_cpu,
    "fill_accept_out_cache_loc_cpu": fill_accept_out_cache_loc_cpu,
    "build_tree_kernel_efficient_cpu": build_tree_kernel_efficient_cpu,
    "verify_tree_greedy_cpu": verify_tree_greedy_cpu,
}
