"""`reference.paged_gqa` as one FlashAttention-style Triton launch over query tiles, mapped to
sequences on the device (grid cdiv(T, BLOCK_M) + N by H, no host read). Scores stay in fp32
where the reference rounds them to q's dtype."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

BLOCK_M = 64
SPLIT_KEYS = True
LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["N", "stride_bt"])  # one variant whatever the batch's shape
def _paged_gqa_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, tables_ptr, cu_ptr, lens_ptr, tile_seq_ptr, tile_idx_ptr,
    N, qk_scale,
    stride_qt, stride_qh, stride_qd, stride_kp, stride_kb, stride_kh, stride_kd,
    stride_vp, stride_vb, stride_vh, stride_vd, stride_ot, stride_oh, stride_od, stride_bt,
    PAGE: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DK2: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile).to(tl.int64)
    if seq >= N:
        return
    kv_head = head // GROUP
    start = tl.load(cu_ptr + seq).to(tl.int64)
    q_len = tl.load(cu_ptr + seq + 1).to(tl.int64) - start
    seq_len = tl.load(lens_ptr + seq).to(tl.int64)
    local = tl.load(tile_idx_ptr + tile).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = local < q_len
    q_pos = tl.where(row_ok, seq_len - q_len + local, seq_len - 1)
    rows = start + local
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + dk[None, :] * stride_qd,
        mask=row_ok[:, None] & (dk < DK)[None, :], other=0.0,
    )  # fmt: skip
    if BLOCK_DK2 > 0:
        dk2 = BLOCK_DK + tl.arange(0, BLOCK_DK2)
        q2 = tl.load(
            q_ptr + rows[:, None] * stride_qt + head * stride_qh + dk2[None, :] * stride_qd,
            mask=row_ok[:, None] & (dk2 < DK)[None, :], other=0.0,
        )  # fmt: skip
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    end = tl.max(tl.where(row_ok, q_pos, 0), axis=0) + 1
    table = tables_ptr + seq * stride_bt
    for n0 in range(0, end, BLOCK_N):
        k_pos = n0 + tl.arange(0, BLOCK_N)
        k_ok = k_pos < seq_len
        block = tl.load(table + k_pos // PAGE, mask=k_ok, other=0).to(tl.int64)
        offset = k_pos % PAGE
        k = tl.load(
            k_ptr
            + block[None, :] * stride_kp
            + offset[None, :] * stride_kb
            + kv_head * stride_kh
            + dk[:, None] * stride_kd,
            mask=k_ok[None, :] & (dk < DK)[:, None],
            other=0.0,
        )  # fmt: skip  [DK, BLOCK_N]
        s = tl.dot(q, k.to(q.dtype), input_precision=PRECISION)
        if BLOCK_DK2 > 0:
            k2 = tl.load(
                k_ptr
                + block[None, :] * stride_kp
                + offset[None, :] * stride_kb
                + kv_head * stride_kh
                + dk2[:, None] * stride_kd,
                mask=k_ok[None, :] & (dk2 < DK)[:, None],
                other=0.0,
            )  # fmt: skip  [BLOCK_DK2, BLOCK_N]
            s += tl.dot(q2, k2.to(q.dtype), input_precision=PRECISION)
        s = s * qk_scale  # log2 units
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_ptr
            + block[:, None] * stride_vp
            + offset[:, None] * stride_vb
            + kv_head * stride_vh
            + dv[None, :] * stride_vd,
            mask=k_ok[:, None] & (dv < DV)[None, :],
            other=0.0,
        )  # fmt: skip  [BLOCK_N, DV]
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        o_ptr + rows[:, None] * stride_ot + head * stride_oh + dv[None, :] * stride_od,
        out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (dv < DV)[None, :],
    )  # fmt: skip


def key_blocks(dk: int, split: bool = True) -> tuple[int, int]:
    """(BLOCK_DK, BLOCK_DK2): a non-power-of-two key width as two dots (MLA 192 = 128 + 64, not
    256 with a quarter of zeros); BLOCK_DK2 = 0 for one dot."""
    whole = max(16, triton.next_power_of_2(dk))
    low = whole // 2
    if not split or whole == dk or low < 16:
        return whole, 0
    return low, max(16, triton.next_power_of_2(dk - low))


def query_tiles(cu_seqlens: torch.Tensor, num_rows: int, block_m: int = BLOCK_M):
    """(tile_seq, tile_idx) [cdiv(T, block_m) + N] of each query tile; spare tiles get seq N."""
    N = cu_seqlens.numel() - 1
    q_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    tiles = (q_lens + block_m - 1) // block_m
    tile_end = tiles.cumsum(0)
    num_tiles = triton.cdiv(num_rows, block_m) + N
    ids = torch.arange(num_tiles, device=cu_seqlens.device)
    tile_seq = torch.searchsorted(tile_end, ids, right=True)
    first = (tile_end - tiles).index_select(0, tile_seq.clamp(max=max(N - 1, 0)))
    return tile_seq, ids - first


def paged_gqa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """`reference.paged_gqa` in one Triton launch; `seq_lens` may be an [N] device tensor."""
    T, H, DK = q.shape
    HKV, DV = k_cache.shape[2], v_cache.shape[-1]
    if H % HKV:
        raise ValueError(f"paged_gqa: {H} query heads, {HKV} kv heads")
    out = q.new_empty(T, H, DV)
    N = cu_seqlens.numel() - 1
    if T == 0 or N == 0:
        return out
    if not isinstance(seq_lens, torch.Tensor):
        seq_lens = torch.tensor(list(seq_lens), dtype=torch.int32).to(q.device, non_blocking=True)
    block_tables, cu_seqlens, seq_lens = (
        t.contiguous() for t in (block_tables, cu_seqlens, seq_lens)
    )
    tile_seq, tile_idx = query_tiles(cu_seqlens, T)
    block_dk, block_dk2 = key_blocks(DK, SPLIT_KEYS)
    block_dv = max(16, triton.next_power_of_2(DV))
    block_n = 64 if max(block_dk, block_dv) <= 128 else 32
    k, v = k_cache, v_cache
    _paged_gqa_kernel[(tile_seq.numel(), H)](
        q, k, v, out, block_tables, cu_seqlens, seq_lens, tile_seq, tile_idx,
        N, scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        out.stride(0), out.stride(1), out.stride(2), block_tables.stride(0),
        PAGE=k.shape[1], GROUP=H // HKV, DK=DK, DV=DV, BLOCK_DK=block_dk, BLOCK_DK2=block_dk2,
        BLOCK_DV=block_dv,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, num_warps=8 if block_dk > 128 else 4, num_stages=2,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return out
