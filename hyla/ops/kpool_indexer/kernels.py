"""The pooled DSA indexer in Triton (`reference.py`'s results; CUDA-graph safe), scoring with
`hyla.ops.dsa_indexer`'s key kernel at POOL = P."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from hyla.ops.dsa_indexer import kernels as dsa_kernels
from hyla.ops.dsa_indexer.rows import row_positions
from hyla.ops.dsa_indexer.select import INVISIBLE

SORT_MAX_POOLS = 4096  # pools per row sorted by one program (64K tokens at P = 16)


@triton.jit
def _pool_keys_kernel(
    key_ptr, gate_ptr, out_ptr, ape_ptr, bt_ptr, row_seq_ptr, row_pos_ptr, slot_ptr,
    stride_kp, stride_kb, stride_gp, stride_gb, stride_op, stride_ob, stride_bt, DI,
    P: tl.constexpr, PAGE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    slot_out = tl.load(slot_ptr + t).to(tl.int64)
    if slot_out >= 0:
        seq = tl.load(row_seq_ptr + t).to(tl.int64)
        pos = tl.load(row_pos_ptr + t)
        i = tl.arange(0, BLOCK_P)
        d = tl.arange(0, BLOCK_D)
        p_mask = i < P
        mask = p_mask[:, None] & (d < DI)[None, :]
        window = tl.maximum(pos - P + 1 + i, 0)
        block = tl.load(bt_ptr + seq * stride_bt + window // PAGE, mask=p_mask, other=0)
        block = block.to(tl.int64)
        offset = (window % PAGE).to(tl.int64)
        k_rows = block * stride_kp + offset * stride_kb
        g_rows = block * stride_gp + offset * stride_gb
        keys = tl.load(key_ptr + k_rows[:, None] + d[None, :], mask=mask, other=0.0)
        gates = tl.load(gate_ptr + g_rows[:, None] + d[None, :], mask=mask, other=0.0)
        ape = tl.load(ape_ptr + i[:, None] * DI + d[None, :], mask=mask, other=0.0)
        logits = tl.where(mask, gates.to(tl.float32) + ape.to(tl.float32), float("-inf"))
        e = tl.exp(logits - tl.max(logits, axis=0)[None, :])
        e = tl.where(mask, e, 0.0)
        probs = (e / tl.sum(e, axis=0)[None, :]).to(keys.dtype).to(tl.float32)
        terms = (probs * keys.to(tl.float32)).to(keys.dtype).to(tl.float32)  # as the reference
        pooled = tl.sum(terms, axis=0)
        slot_block, slot_offset = slot_out // PAGE, slot_out % PAGE
        dst = out_ptr + slot_block * stride_op + slot_offset * stride_ob + d
        tl.store(dst, pooled.to(out_ptr.dtype.element_ty), mask=d < DI)


def write_pool_keys(
    key_cache: torch.Tensor,
    gate_cache: torch.Tensor,
    pool_key_cache: torch.Tensor,
    ape: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    slot_mapping: torch.Tensor,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """`reference.write_pool_keys` in one launch; rows with a slot < 0 (padding) are skipped."""
    num_rows, kpool, page = slot_mapping.shape[0], ape.shape[0], key_cache.shape[1]
    if num_rows == 0:
        return
    for cache in (key_cache, gate_cache, pool_key_cache):
        if cache.stride(2) != 1:
            raise ValueError("write_pool_keys: the caches need a contiguous last dim")
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    block_tables = block_tables.contiguous()
    dim = key_cache.shape[2]
    _pool_keys_kernel[(num_rows,)](
        key_cache, gate_cache, pool_key_cache, ape.contiguous(), block_tables, row_seq, row_pos,
        slot_mapping, key_cache.stride(0), key_cache.stride(1), gate_cache.stride(0),
        gate_cache.stride(1), pool_key_cache.stride(0), pool_key_cache.stride(1),
        block_tables.stride(0), dim, P=kpool, PAGE=page,
        BLOCK_P=max(2, triton.next_power_of_2(kpool)), BLOCK_D=triton.next_power_of_2(dim),
    )  # fmt: skip


@triton.jit
def _expand_pools_kernel(
    pools_ptr, row_pos_ptr, out_ptr, K, WIDTH,
    P: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, TAIL: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_K)
    i = tl.arange(0, BLOCK_P)
    pools = tl.load(pools_ptr + t * K + r, mask=r < K, other=-1)
    tokens = tl.where(pools[:, None] >= 0, pools[:, None] * P + i[None, :], -1)
    mask = (r < K)[:, None] & (i < P)[None, :]
    tl.store(out_ptr + t * WIDTH + r[:, None] * P + i[None, :], tokens, mask=mask)
    if TAIL:
        pos = tl.load(row_pos_ptr + t)
        tail = (pos + 1) // P * P + i
        tail = tl.where(tail <= pos, tail, -1).to(tl.int32)
        tl.store(out_ptr + t * WIDTH + K * P + i, tail, mask=i < P - 1)


@triton.jit
def _sort_expand_kernel(
    keys_ptr, row_pos_ptr, out_ptr, L, K, WIDTH, row_offset,
    P: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
    TAIL: tl.constexpr, INVISIBLE: tl.constexpr,
):  # fmt: skip
    # the sorted pools go back to the row's (scratch) key buffer, then the first K are read
    # again as a [BLOCK_K, BLOCK_P] tile: a [BLOCK_L, BLOCK_P] one would not fit in registers
    t = tl.program_id(0).to(tl.int64)
    row = row_offset + t
    key_row = keys_ptr + t * L
    rank = tl.arange(0, BLOCK_L)
    key = tl.load(key_row + rank, mask=rank < L, other=INVISIBLE)
    key = tl.sort(key, descending=True)
    pos = tl.load(row_pos_ptr + row)
    keep = rank < (pos + 1) // P  # invisible pools rank last
    pools = tl.where(keep, 0x7FFFFFFF - (key & 0x7FFFFFFF), -1)
    tl.debug_barrier()  # every thread has read its keys before any is overwritten
    tl.store(key_row + rank, pools, mask=(rank < L) & (rank < K))
    tl.debug_barrier()
    r = tl.arange(0, BLOCK_K)
    best = tl.load(key_row + r, mask=(r < L) & (r < K), other=-1).to(tl.int32)
    i = tl.arange(0, BLOCK_P)
    tokens = tl.where(best[:, None] >= 0, best[:, None] * P + i[None, :], -1)
    mask = (r < K)[:, None] & (i < P)[None, :]
    tl.store(out_ptr + row * WIDTH + r[:, None] * P + i[None, :], tokens, mask=mask)
    if TAIL:
        tail = (pos + 1) // P * P + i
        tail = tl.where(tail <= pos, tail, -1).to(tl.int32)
        tl.store(out_ptr + row * WIDTH + K * P + i, tail, mask=i < P - 1)


def kpool_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    pool_key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    max_seq_len: int,
    topk: int,
    kpool: int,
    always_select_tail: bool,
    softmax_scale: float,
    *,
    static_shapes: bool = False,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """`reference.kpool_indexer_topk` (scores to fp32 rounding: near-ties may order differently)."""
    num_rows = q.shape[0]
    k_pools = topk // kpool
    width = k_pools * kpool + (kpool - 1 if always_select_tail else 0)
    out = torch.empty(num_rows, width, dtype=torch.int32, device=q.device)
    if num_rows == 0:
        return out
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    num_pools = max(max_seq_len // kpool, 1)
    block_t = 1 if num_rows <= cu_seqlens.shape[0] - 1 else dsa_kernels.BLOCK_T_PREFILL
    chunk = dsa_kernels._rows_per_chunk(num_rows, num_pools, block_t)
    keys = torch.empty(chunk, num_pools, dtype=torch.int64, device=q.device)
    block_p = max(2, triton.next_power_of_2(kpool))
    sort = num_pools <= SORT_MAX_POOLS
    if not sort:
        pools = torch.empty(num_rows, k_pools, dtype=torch.int32, device=q.device)
    last_visible = None if sort else (row_pos + 1) // kpool - 1  # rank r kept while r <= this
    for start in range(0, num_rows, chunk):
        n = min(chunk, num_rows - start)
        dsa_kernels._launch(
            q, weights, pool_key_cache, None, block_tables, row_seq, row_pos, keys[:n], start,
            softmax_scale, block_t, write_keys=True, pool=kpool,
        )  # fmt: skip
        if sort:
            block_l = max(2, triton.next_power_of_2(num_pools))
            _sort_expand_kernel[(n,)](
                keys, row_pos, out, num_pools, k_pools, width, start, P=kpool, BLOCK_L=block_l,
                BLOCK_K=max(2, triton.next_power_of_2(k_pools)), BLOCK_P=block_p,
                TAIL=always_select_tail, INVISIBLE=INVISIBLE, num_warps=8 if block_l > 1024 else 4,
            )  # fmt: skip
        else:
            pools[start : start + n] = dsa_kernels.keys_to_topk(
                keys[:n], last_visible[start : start + n], k_pools, static_shapes
            )
    if sort:
        return out
    _expand_pools_kernel[(num_rows,)](
        pools, row_pos, out, k_pools, width, P=kpool,
        BLOCK_K=max(2, triton.next_power_of_2(k_pools)),
        BLOCK_P=max(2, triton.next_power_of_2(kpool)), TAIL=always_select_tail,
    )  # fmt: skip
    return out
