"""Lightning indexer + deterministic top-k in Triton (`reference.lightning_indexer_topk`'s fast
path): scores become int64 sort keys (order-preserving float bits, then 2^31 - 1 - column), so
torch.topk yields the reference's stable descending order."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from hyla.ops.dsa_indexer.rows import row_positions
from hyla.ops.dsa_indexer.select import (
    INVISIBLE,
    segmented_topk_columns,
    topk_columns_reference,
)
from hyla.ops.dsa_indexer.topk import radix_topk_columns
from hyla.ops.gpu import triton_runs_on

# The int64 key buffer holds at most this many entries (1 GiB); rows are chunked to fit.
MAX_KEY_ELEMENTS = 1 << 27
# Tunables (sweep on the H200: bench/gpu_dsa_decode.py reads overrides from the environment).
BLOCK_N = 128
BLOCK_T_PREFILL = 16  # query rows per program when some sequence has several new tokens
NUM_WARPS = 4
NUM_STAGES = 2
# Eager steps use the radix top-k from this many columns on; None: only captured steps.
RADIX_MIN_COLS: int | None = None
RADIX_MAX_ROWS = 65535  # the radix select's grid limit
# `select.segmented_topk_columns` from this many columns on; None: never (slower on the H200).
SEGMENTED_MIN_COLS: int | None = None


@triton.jit
def _indexer_key_kernel(
    q_ptr,
    w_ptr,
    k_ptr,
    ks_ptr,
    bt_ptr,
    row_seq_ptr,
    row_pos_ptr,
    out_ptr,
    num_rows,
    num_cols,
    row_offset,
    stride_qt,
    stride_qh,
    stride_wt,
    stride_kp,
    stride_kb,
    stride_ksp,
    stride_bt,
    stride_out,
    scale,
    w_scale,
    HI: tl.constexpr,
    DI: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    IEEE: tl.constexpr,
    WRITE_KEYS: tl.constexpr,
    INVISIBLE: tl.constexpr,
    POOL: tl.constexpr,
):
    """Column c is the key at position c * POOL + POOL - 1 (POOL > 1: `hyla.ops.kpool_indexer`)."""
    pid_n = tl.program_id(0)
    pid_t = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    key_pos = cols * POOL + (POOL - 1)
    offs_h = tl.arange(0, BLOCK_H).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < HI
    mask_d = offs_d < DI
    in_range = cols < num_cols
    for r in range(BLOCK_T):
        t = pid_t * BLOCK_T + r
        if t < num_rows:
            row = row_offset + t
            seq = tl.load(row_seq_ptr + row).to(tl.int64)
            pos = tl.load(row_pos_ptr + row)
            visible = key_pos <= pos
            out_row = out_ptr + t.to(tl.int64) * stride_out + cols
            if pid_n * BLOCK_N * POOL + POOL - 1 <= pos:
                page = key_pos // PAGE
                blocks = tl.load(bt_ptr + seq * stride_bt + page, mask=visible, other=0)
                slot = blocks.to(tl.int64) * stride_kp + (key_pos % PAGE).to(tl.int64) * stride_kb
                kmask = visible[:, None] & mask_d[None, :]
                k = tl.load(k_ptr + slot[:, None] + offs_d[None, :], mask=kmask, other=0.0)
                q_rows = q_ptr + row.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
                qmask = mask_h[:, None] & mask_d[None, :]
                q = tl.load(q_rows + offs_d[None, :], mask=qmask, other=0.0)
                if IEEE:
                    q = q.to(tl.float32)
                    k = k.to(tl.float32)
                    s = tl.dot(q, tl.trans(k), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k.to(q.dtype)))
                if HAS_SCALE:
                    ks_slot = blocks.to(tl.int64) * stride_ksp + key_pos % PAGE
                    s = s * tl.load(ks_ptr + ks_slot, mask=visible, other=0.0)[None, :]
                s = tl.maximum(s * scale, 0.0)
                w = tl.load(w_ptr + row.to(tl.int64) * stride_wt + offs_h, mask=mask_h, other=0.0)
                score = tl.sum(s * (w.to(tl.float32) * w_scale)[:, None], axis=0)
                if WRITE_KEYS:
                    bits = (score + 0.0).to(tl.int32, bitcast=True)
                    key32 = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
                    key = (key32.to(tl.int64) << 31) | (0x7FFFFFFF - cols).to(tl.int64)
                    key = tl.where(visible, key, INVISIBLE)
                    tl.store(out_row, key, mask=in_range)
                else:
                    tl.store(out_row, tl.where(visible, score, float("-inf")), mask=in_range)
            else:
                if WRITE_KEYS:
                    tl.store(out_row, tl.full([BLOCK_N], INVISIBLE, tl.int64), mask=in_range)
                else:
                    tl.store(out_row, tl.full([BLOCK_N], float("-inf"), tl.float32), mask=in_range)


def _launch(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_key_cache: torch.Tensor,
    index_key_scale: torch.Tensor | None,
    block_tables: torch.Tensor,
    row_seq: torch.Tensor,
    row_pos: torch.Tensor,
    out: torch.Tensor,
    row_offset: int,
    softmax_scale: float,
    block_t: int,
    write_keys: bool,
    pool: int = 1,
) -> None:
    num_rows, num_cols = out.shape
    num_heads, head_dim = q.shape[1], q.shape[2]
    if q.stride(2) != 1 or index_key_cache.stride(2) != 1:
        raise ValueError("lightning_indexer_topk: q and the key cache need a contiguous last dim")
    # the kernel reads these with unit strides along their last dim (no-ops when contiguous)
    weights, block_tables = weights.contiguous(), block_tables.contiguous()
    if index_key_scale is not None:
        index_key_scale = index_key_scale.contiguous()
    scale_arg = index_key_scale if index_key_scale is not None else weights
    grid = (triton.cdiv(num_cols, BLOCK_N), triton.cdiv(num_rows, block_t))
    _indexer_key_kernel[grid](
        q,
        weights,
        index_key_cache,
        scale_arg,
        block_tables,
        row_seq,
        row_pos,
        out,
        num_rows,
        num_cols,
        row_offset,
        q.stride(0),
        q.stride(1),
        weights.stride(0),
        index_key_cache.stride(0),
        index_key_cache.stride(1),
        scale_arg.stride(0),
        block_tables.stride(0),
        out.stride(0),
        softmax_scale,
        num_heads**-0.5,
        HI=num_heads,
        DI=head_dim,
        PAGE=index_key_cache.shape[1],
        BLOCK_H=max(16, triton.next_power_of_2(num_heads)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_N=BLOCK_N,
        BLOCK_T=block_t,
        HAS_SCALE=index_key_scale is not None,
        IEEE=_ieee(q),
        WRITE_KEYS=write_keys,
        INVISIBLE=INVISIBLE,
        POOL=pool,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )


def _ieee(q: torch.Tensor) -> bool:
    """fp32 dots for fp32 q and under TRITON_INTERPRET, whose bf16 tl.dot is wrong (triton 3.9)."""
    return q.dtype == torch.float32 or q.device.type != "cuda"


def _rows_per_chunk(num_rows: int, num_cols: int, block_t: int) -> int:
    rows = max(1, MAX_KEY_ELEMENTS // max(num_cols, 1))
    return min(num_rows, rows, 65535 * block_t)


def keys_to_topk(
    keys: torch.Tensor, row_pos: torch.Tensor, topk: int, static_shapes: bool = False
) -> torch.Tensor:
    """[Tc, L] int64 sort keys -> [Tc, topk] int32 columns: radix, segmented or plain torch.topk."""
    radix = static_shapes or (RADIX_MIN_COLS is not None and keys.shape[1] >= RADIX_MIN_COLS)
    radix = radix and keys.shape[0] <= RADIX_MAX_ROWS
    if topk > 0 and radix and triton_runs_on(keys):
        return radix_topk_columns(keys, row_pos, topk)
    if topk > 0 and SEGMENTED_MIN_COLS is not None and keys.shape[1] >= SEGMENTED_MIN_COLS:
        return segmented_topk_columns(keys, row_pos, topk)
    return topk_columns_reference(keys, row_pos, topk)


def lightning_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    topk: int,
    softmax_scale: float,
    index_key_scale: torch.Tensor | None = None,
    *,
    max_seq_len: int | None = None,
    static_shapes: bool = False,
) -> torch.Tensor:
    """`hyla.ops.dsa_indexer.lightning_indexer_topk` on CUDA (scores to fp32 rounding: another
    head-sum order). Raises ValueError when q or the cache has a strided last dim."""
    num_rows = q.shape[0]
    out = torch.full((num_rows, topk), -1, dtype=torch.int32, device=q.device)
    num_cols = max(seq_lens, default=0) if max_seq_len is None else max_seq_len
    if num_rows == 0 or num_cols == 0:
        return out
    row_seq, row_pos = row_positions(cu_seqlens, seq_lens, num_rows)
    block_t = 1 if num_rows <= len(seq_lens) else BLOCK_T_PREFILL
    chunk = _rows_per_chunk(num_rows, num_cols, block_t)
    keys = torch.empty(chunk, num_cols, dtype=torch.int64, device=q.device)
    for start in range(0, num_rows, chunk):
        n = min(chunk, num_rows - start)
        _launch(
            q, weights, index_key_cache, index_key_scale, block_tables, row_seq, row_pos,
            keys[:n], start, softmax_scale, block_t, write_keys=True,
        )  # fmt: skip
        out[start : start + n] = keys_to_topk(
            keys[:n], row_pos[start : start + n], topk, static_shapes
        )
    return out


def indexer_scores_paged(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    softmax_scale: float,
    index_key_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel's fp32 scores (tests, tuning): [T, max(seq_lens)], -inf where not visible."""
    num_rows, num_cols = q.shape[0], max(seq_lens, default=0)
    out = torch.empty(num_rows, num_cols, dtype=torch.float32, device=q.device)
    if num_rows and num_cols:
        row_seq, row_pos = row_positions(cu_seqlens, seq_lens, num_rows)
        _launch(
            q, weights, index_key_cache, index_key_scale, block_tables, row_seq, row_pos, out,
            0, softmax_scale, 1, write_keys=False,
        )  # fmt: skip
    return out
