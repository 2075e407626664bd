"""Sparse MLA in Triton: o_lat over the selected latent rows with an online fp32 softmax, one
program per (head block, row, split of the top-k list); a second kernel merges decode splits."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.dsa_indexer.kernels import _ieee
from hyla.ops.dsa_indexer.rows import row_sequences
from hyla.ops.mla.reference import split_kv_b

# Tunables (sweep on the H200: bench/gpu_dsa_decode.py reads overrides from the environment).
BLOCK_H = 32  # heads per program (>= 16 for tl.dot)
BLOCK_N = 32
NUM_WARPS = 8
NUM_STAGES = 2
PROGRAMS_PER_SM = 2  # decode: split the top-k list until about this many programs per SM
MIN_IDX_PER_SPLIT = 64  # ... but not below this many indices per split (partials cost traffic)
_LOG2E = 1.4426950408889634


@triton.jit
def _sparse_mla_kernel(
    ql_ptr,
    qr_ptr,
    c_ptr,
    cs_ptr,
    bt_ptr,
    row_seq_ptr,
    idx_ptr,
    pos_ptr,
    o_ptr,
    ml_ptr,
    num_heads,
    num_idx,
    idx_per_split,
    stride_qlt,
    stride_qlh,
    stride_qrt,
    stride_qrh,
    stride_cp,
    stride_cb,
    stride_sp,
    stride_sb,
    stride_bt,
    stride_it,
    stride_ot,
    stride_oh,
    stride_os,
    stride_mt,
    stride_mh,
    qk_scale,
    R: tl.constexpr,
    DR: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
    DENSE: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    pid_h = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    pid_s = tl.program_id(2)
    # int64: q_lat's head stride is T * R (a transposed bmm), past 2^31 at ~33k rows, H = 128
    heads = (pid_h * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    offs_dr = tl.arange(0, BLOCK_DR)
    mask_h = heads < num_heads
    mask_r = offs_r < R
    mask_dr = offs_dr < DR
    ql_rows = ql_ptr + t * stride_qlt + heads[:, None] * stride_qlh
    q_lat = tl.load(ql_rows + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :], other=0.0)
    qr_rows = qr_ptr + t * stride_qrt + heads[:, None] * stride_qrh
    q_rope = tl.load(qr_rows + offs_dr[None, :], mask=mask_h[:, None] & mask_dr[None, :], other=0.0)
    if IEEE:
        q_lat = q_lat.to(tl.float32)
        q_rope = q_rope.to(tl.float32)
    seq = tl.load(row_seq_ptr + t).to(tl.int64)

    m = tl.full([BLOCK_H], -1.0e30, tl.float32)  # running max (log2 units); finite: no inf-inf
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    start = pid_s * idx_per_split
    end = tl.minimum(start + idx_per_split, num_idx)
    if DENSE:
        end = tl.minimum(end, (tl.load(pos_ptr + t) + 1).to(tl.int32))
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if DENSE:
            idx = offs_n
            valid = offs_n < end
        else:
            idx = tl.load(idx_ptr + t * stride_it + offs_n, mask=offs_n < end, other=-1)
            valid = idx >= 0
        if tl.max(valid.to(tl.int32), axis=0) > 0:
            blocks = tl.load(bt_ptr + seq * stride_bt + idx // PAGE, mask=valid, other=0)
            rows = blocks.to(tl.int64) * stride_cp + (idx % PAGE).to(tl.int64) * stride_cb
            c_mask = valid[:, None] & mask_r[None, :]
            c = tl.load(c_ptr + rows[:, None] + offs_r[None, :], mask=c_mask, other=0.0)
            kr_mask = valid[:, None] & mask_dr[None, :]
            kr = tl.load(c_ptr + rows[:, None] + R + offs_dr[None, :], mask=kr_mask, other=0.0)
            if HAS_SCALE:  # an fp8 cache: e4m3 rows times their token's scale
                s_rows = blocks.to(tl.int64) * stride_sp + (idx % PAGE).to(tl.int64) * stride_sb
                sc = tl.load(cs_ptr + s_rows, mask=valid, other=0.0)
                c = c.to(tl.float32) * sc[:, None]
                kr = kr.to(tl.float32) * sc[:, None]
            if IEEE:
                c = c.to(tl.float32)
                kr = kr.to(tl.float32)
                s = tl.dot(q_lat, tl.trans(c), input_precision="ieee")
                s = tl.dot(q_rope, tl.trans(kr), s, input_precision="ieee")
            else:
                c = c.to(q_lat.dtype)
                kr = kr.to(q_lat.dtype)
                s = tl.dot(q_lat, tl.trans(c))
                s = tl.dot(q_rope, tl.trans(kr), s)
            s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new[:, None])
            lsum = lsum * alpha + tl.sum(p, axis=1)
            if IEEE:
                acc = tl.dot(p, c, acc * alpha[:, None], input_precision="ieee")
            else:
                acc = tl.dot(p.to(c.dtype), c, acc * alpha[:, None])
            m = m_new
    if SPLIT:
        o_rows = o_ptr + t * stride_ot + heads[:, None] * stride_oh + pid_s * stride_os
        tl.store(o_rows + offs_r[None, :], acc, mask=mask_h[:, None] & mask_r[None, :])
        ml_rows = ml_ptr + t * stride_mt + heads * stride_mh + pid_s * 2
        tl.store(ml_rows, m, mask=mask_h)
        tl.store(ml_rows + 1, lsum, mask=mask_h)
    else:
        o_rows = o_ptr + t * stride_ot + heads[:, None] * stride_oh
        o = (acc / lsum[:, None]).to(o_ptr.dtype.element_ty)
        tl.store(o_rows + offs_r[None, :], o, mask=mask_h[:, None] & mask_r[None, :])


@triton.jit
def _merge_splits_kernel(
    part_ptr,
    ml_ptr,
    o_ptr,
    num_splits,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_mt,
    stride_mh,
    stride_ot,
    stride_oh,
    R: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    h = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_r = tl.arange(0, BLOCK_R)
    mask_s = offs_s < num_splits
    ml_rows = ml_ptr + t * stride_mt + h * stride_mh + offs_s * 2
    m = tl.load(ml_rows, mask=mask_s, other=-1.0e30)
    lsum = tl.load(ml_rows + 1, mask=mask_s, other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))  # empty splits have lsum = 0, acc = 0
    parts = part_ptr + t * stride_pt + h * stride_ph + offs_s[:, None] * stride_ps
    acc = tl.load(parts + offs_r[None, :], mask=mask_s[:, None] & (offs_r < R)[None, :], other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(lsum * w, axis=0)
    o_row = o_ptr + t * stride_ot + h * stride_oh + offs_r
    tl.store(o_row, o.to(o_ptr.dtype.element_ty), mask=offs_r < R)


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # TRITON_INTERPRET on CPU tensors: exercise the split path on tiny shapes
    return torch.cuda.get_device_properties(device).multi_processor_count


def _num_splits(num_rows: int, num_head_blocks: int, num_idx: int, device: torch.device) -> int:
    programs = num_rows * num_head_blocks
    wanted = triton.cdiv(PROGRAMS_PER_SM * _num_sms(device), programs)
    return max(1, min(wanted, triton.cdiv(num_idx, max(BLOCK_N, MIN_IDX_PER_SPLIT))))


def sparse_latent_attention(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    row_seq: torch.Tensor,
    topk_indices: torch.Tensor,
    scale: float,
    *,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q_lat: [T, H, R], q_rope: [T, H, Dr]; topk_indices: [T, k] (-1: none). Returns o_lat
    [T, H, R]; a row selecting no token gives NaN (checking would sync)."""
    topk_indices = topk_indices.to(torch.int32).contiguous()  # the kernel reads unit strides
    return _latent_attention(
        q_lat, q_rope, latent_cache, block_tables, row_seq, topk_indices, None,
        topk_indices.shape[1], scale, latent_scale,
    )  # fmt: skip


def dense_latent_attention(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    row_seq: torch.Tensor,
    row_pos: torch.Tensor,
    max_seq_len: int,
    scale: float,
    *,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`sparse_latent_attention` over positions 0 .. row_pos[t] (dense causal MLA)."""
    return _latent_attention(
        q_lat, q_rope, latent_cache, block_tables, row_seq, None, row_pos.contiguous(),
        max_seq_len, scale, latent_scale,
    )  # fmt: skip


def _latent_attention(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    row_seq: torch.Tensor,
    topk_indices: torch.Tensor | None,
    row_pos: torch.Tensor | None,
    num_idx: int,
    scale: float,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    num_rows, num_heads, rank = q_lat.shape
    dr = q_rope.shape[-1]
    o_lat = q_lat.new_empty(num_rows, num_heads, rank)
    if num_rows == 0 or num_idx == 0:
        return o_lat
    if q_lat.stride(-1) != 1 or q_rope.stride(-1) != 1 or latent_cache.stride(-1) != 1:
        raise ValueError("sparse_mla: q_lat, q_rope and the cache need a contiguous last dim")
    dense = topk_indices is None
    block_tables = block_tables.contiguous()
    block_h = min(BLOCK_H, max(16, triton.next_power_of_2(num_heads)))
    num_head_blocks = triton.cdiv(num_heads, block_h)
    splits = _num_splits(num_rows, num_head_blocks, num_idx, q_lat.device)
    per_split = triton.cdiv(triton.cdiv(num_idx, BLOCK_N), splits) * BLOCK_N
    splits = triton.cdiv(num_idx, per_split)
    block_r = max(16, triton.next_power_of_2(rank))
    if splits > 1:
        part = torch.empty(num_rows, num_heads, splits, rank, device=q_lat.device)
        ml = torch.empty(num_rows, num_heads, splits, 2, device=q_lat.device)
        out, strides = part, (part.stride(0), part.stride(1), part.stride(2))
    else:
        ml = o_lat
        out, strides = o_lat, (o_lat.stride(0), o_lat.stride(1), 0)
    idx_arg = row_pos if dense else topk_indices  # a placeholder pointer where unused
    has_scale = latent_scale is not None
    cs = latent_scale if has_scale else latent_cache
    cs_strides = (cs.stride(0), cs.stride(1)) if has_scale else (0, 0)
    _sparse_mla_kernel[(num_head_blocks, num_rows, splits)](
        q_lat, q_rope, latent_cache, cs, block_tables, row_seq, idx_arg,
        row_pos if dense else topk_indices, out, ml,
        num_heads, num_idx, per_split,
        q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1),
        latent_cache.stride(0), latent_cache.stride(1), *cs_strides, block_tables.stride(0),
        0 if dense else topk_indices.stride(0), *strides, ml.stride(0), ml.stride(1),
        scale * _LOG2E,
        R=rank,
        DR=dr,
        PAGE=latent_cache.shape[1],
        BLOCK_H=block_h,
        BLOCK_R=block_r,
        BLOCK_DR=max(16, triton.next_power_of_2(dr)),
        BLOCK_N=BLOCK_N,
        SPLIT=splits > 1,
        IEEE=_ieee(q_lat),
        DENSE=dense,
        HAS_SCALE=has_scale,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )  # fmt: skip
    if splits > 1:
        _merge_splits_kernel[(num_heads, num_rows)](
            part, ml, o_lat, splits,
            part.stride(0), part.stride(1), part.stride(2), ml.stride(0), ml.stride(1),
            o_lat.stride(0), o_lat.stride(1),
            R=rank,
            BLOCK_R=block_r,
            BLOCK_S=max(2, triton.next_power_of_2(splits)),
            num_warps=4,
        )  # fmt: skip
    return o_lat


def sparse_mla(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    topk_indices: torch.Tensor,
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`reference.sparse_mla` on CUDA (no sync: NaN for an empty row); probabilities enter the
    value sum in the latent dtype."""
    num_rows, num_heads, dn = q_nope.shape
    w_uk, w_uv = split_kv_b(kv_b_weight, num_heads, dn)
    q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
    row_seq = row_sequences(cu_seqlens, num_rows)
    o_lat = sparse_latent_attention(
        q_lat,
        q_rope,
        latent_cache,
        block_tables,
        row_seq,
        topk_indices,
        scale,
        latent_scale=latent_scale,
    )
    return torch.bmm(o_lat.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
