"""Triton routed experts for a few tokens: two GEMVs read each pair's expert in place, rounded
as `kernels._gathered` + `kernels._weighted_sum`. No host sync."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    sw_ptr,
    ids_ptr,
    h_ptr,
    P,
    D,
    I,
    stride_xt,
    stride_we,
    stride_wr,
    stride_hp,
    limit,
    TOPK: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CLAMP: tl.constexpr,
):
    # programs p >= P: token p - P through the shared expert (sw_ptr, same row stride)
    p = tl.program_id(0).to(tl.int64)
    pid_i = tl.program_id(1)
    routed = p < P
    t = tl.where(routed, p // TOPK, p - P)
    e = tl.load(ids_ptr + p, mask=routed, other=0).to(tl.int64)
    offs_i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < I
    base = tl.where(routed, w_ptr + e * stride_we, sw_ptr)
    w_gate = base + offs_i[:, None].to(tl.int64) * stride_wr
    w_up = w_gate + I * stride_wr
    acc_g = tl.zeros([BLOCK_I], tl.float32)
    acc_u = tl.zeros([BLOCK_I], tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        x = tl.load(x_ptr + t * stride_xt + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        mask = mask_i[:, None] & mask_d[None, :]
        wg = tl.load(w_gate + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        wu = tl.load(w_up + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        acc_g += tl.sum(wg * x[None, :], axis=1)
        acc_u += tl.sum(wu * x[None, :], axis=1)
    dtype = h_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    u = acc_u.to(dtype).to(tl.float32)
    if CLAMP:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(h_ptr + p * stride_hp + offs_i, (s * u).to(dtype), mask=mask_i)


@triton.jit
def _down_sum_kernel(
    h_ptr,
    w_ptr,
    sw_ptr,
    ids_ptr,
    wts_ptr,
    out_ptr,
    P,
    D,
    I,
    stride_hp,
    stride_we,
    stride_wr,
    stride_swr,
    stride_ot,
    TOPK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_I: tl.constexpr,
    SHARED: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < TOPK
    ids = tl.load(ids_ptr + t * TOPK + offs_k, mask=mask_k, other=0).to(tl.int64)
    wts = tl.load(wts_ptr + t * TOPK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    # all k slots' tiles loaded at once: k times the bytes in flight of a loop over the slots
    w_rows = w_ptr + ids[:, None, None] * stride_we + offs_d[None, :, None].to(tl.int64) * stride_wr
    h_rows = h_ptr + (t * TOPK + offs_k)[:, None] * stride_hp
    acc = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
    for i0 in range(0, I, BLOCK_I):
        offs_i = i0 + tl.arange(0, BLOCK_I)
        mask_i = offs_i < I
        h = tl.load(h_rows + offs_i[None, :], mask=mask_k[:, None] & mask_i[None, :], other=0.0)
        mask = mask_k[:, None, None] & mask_d[None, :, None] & mask_i[None, None, :]
        wd = tl.load(w_rows + offs_i[None, None, :], mask=mask, other=0.0)
        acc += tl.sum(wd.to(tl.float32) * h.to(tl.float32)[:, None, :], axis=2)
    dtype = out_ptr.dtype.element_ty
    terms = (acc.to(dtype).to(tl.float32) * wts[:, None]).to(dtype).to(tl.float32)
    out = _sum_ascending(terms, ids, mask_k, TOPK, dtype)
    if SHARED:
        s_rows = sw_ptr + offs_d[:, None].to(tl.int64) * stride_swr
        acc_s = tl.zeros([BLOCK_D], tl.float32)
        for i0 in range(0, I, BLOCK_I):
            offs_i = i0 + tl.arange(0, BLOCK_I)
            mask_i = offs_i < I
            h = tl.load(h_ptr + (P + t) * stride_hp + offs_i, mask=mask_i, other=0.0)
            ws = tl.load(
                s_rows + offs_i[None, :], mask=mask_d[:, None] & mask_i[None, :], other=0.0
            )
            acc_s += tl.sum(ws.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
        out = (out + acc_s.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + offs_d, out.to(dtype), mask=mask_d)


@triton.jit
def _sum_ascending(terms, ids, mask_k, TOPK: tl.constexpr, dtype: tl.constexpr):
    """Rows of terms summed in ascending id order, each add rounded (the reference's index_add_)."""
    big = tl.where(mask_k, ids, 1 << 62)
    rank = tl.sum((big[None, :] < big[:, None]).to(tl.int32), axis=1)
    out = tl.sum(tl.where((rank == 0)[:, None], terms, 0.0), axis=0)
    for r in tl.static_range(1, TOPK):
        term = tl.sum(tl.where((rank == r)[:, None], terms, 0.0), axis=0)
        out = (out + term).to(dtype).to(tl.float32)
    return out


@triton.jit
def _combine_kernel(
    y_ptr,
    ids_ptr,
    wts_ptr,
    out_ptr,
    D,
    stride_ye,
    stride_yt,
    stride_ot,
    TOPK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < TOPK
    ids = tl.load(ids_ptr + t * TOPK + offs_k, mask=mask_k, other=0).to(tl.int64)
    wts = tl.load(wts_ptr + t * TOPK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = mask_k[:, None] & (offs_d < D)[None, :]
    y = tl.load(y_ptr + ids[:, None] * stride_ye + t * stride_yt + offs_d[None, :], mask=mask)
    dtype = out_ptr.dtype.element_ty
    terms = (y.to(tl.float32) * wts[:, None]).to(dtype).to(tl.float32)
    out = _sum_ascending(terms, ids, mask_k, TOPK, dtype)
    tl.store(out_ptr + t * stride_ot + offs_d, out.to(dtype), mask=offs_d < D)


@dataclass(frozen=True)
class GemvBlocks:
    """GEMV tiles (tuning only): rows per program and columns per load of each kernel."""

    gate_rows: int = 4
    gate_cols: int = 2048
    gate_warps: int = 4
    down_rows: int = 8
    down_cols: int = 128
    down_warps: int = 8


def pick_blocks(num_tokens: int, inter: int, dim: int) -> GemvBlocks:
    """The H200 sweep's picks (bench/gpu_gemv_sweep.py)."""
    return GemvBlocks(
        down_rows=4 if num_tokens * dim < 4096 else 8, down_cols=256 if inter <= 512 else 128
    )


def moe_gemv(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    blocks: GemvBlocks | None = None,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
    limit: float | None = None,
) -> torch.Tensor:
    """hidden_states [T, D], gate_up_proj [E, 2I, D], down_proj [E, D, I], topk_weights /
    topk_ids [T, k] (distinct ids per row) -> [T, D]. `shared` = (gate_up [2I, D], down [D, I]):
    a shared expert added to every token (`shared_fits`); `limit`: the clamped SwiGLU."""
    num_tokens, topk = topk_ids.shape
    inter, dim = down_proj.shape[2], hidden_states.shape[1]
    out = hidden_states.new_empty(num_tokens, dim)
    if num_tokens == 0:
        return out
    if gate_up_proj.stride(-1) != 1 or down_proj.stride(-1) != 1:
        raise ValueError("moe_gemv: expert weights need a contiguous last dim")
    if shared is not None and not shared_fits(gate_up_proj, down_proj, *shared):
        raise ValueError("moe_gemv: shared expert weights do not match the routed experts")
    s_gate_up, s_down = shared if shared is not None else (gate_up_proj, down_proj)
    b = blocks or pick_blocks(num_tokens, inter, dim)
    x = hidden_states.contiguous()
    ids = topk_ids.contiguous()
    wts = topk_weights.contiguous()
    num_pairs = num_tokens * topk
    rows = num_pairs + (num_tokens if shared is not None else 0)
    h = hidden_states.new_empty(rows, inter)
    _gate_up_kernel[(rows, triton.cdiv(inter, b.gate_rows))](
        x, gate_up_proj, s_gate_up, ids, h, num_pairs, dim, inter,
        x.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1), h.stride(0),
        0.0 if limit is None else float(limit),
        TOPK=topk, BLOCK_I=b.gate_rows, BLOCK_D=min(b.gate_cols, _pow2(dim)),
        CLAMP=limit is not None, num_warps=b.gate_warps,
    )  # fmt: skip
    _down_sum_kernel[(num_tokens, triton.cdiv(dim, b.down_rows))](
        h, down_proj, s_down, ids, wts, out, num_pairs, dim, inter,
        h.stride(0), down_proj.stride(0), down_proj.stride(1), s_down.stride(0), out.stride(0),
        TOPK=topk, BLOCK_K=_pow2(topk), BLOCK_D=b.down_rows,
        BLOCK_I=min(b.down_cols, _pow2(inter)), SHARED=shared is not None,
        num_warps=b.down_warps,
    )  # fmt: skip
    return out


def shared_fits(
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    shared_gate_up: torch.Tensor,
    shared_down: torch.Tensor,
) -> bool:
    """Same width, dtype, device and row stride as the routed experts."""
    return (
        shared_gate_up.shape == gate_up_proj.shape[1:]
        and shared_down.shape == down_proj.shape[1:]
        and shared_gate_up.dtype == shared_down.dtype == gate_up_proj.dtype
        and shared_gate_up.device == shared_down.device == gate_up_proj.device
        and shared_gate_up.stride(-1) == 1
        and shared_down.stride(-1) == 1
        and shared_gate_up.stride(0) == gate_up_proj.stride(1)
    )


COMBINE_BLOCK_D = 512


def combine(
    y: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """`kernels._weighted_sum` of the dense outputs y [E, T, D] in one kernel -> [T, D]."""
    num_tokens, topk = topk_ids.shape
    dim = y.shape[2]
    out = torch.empty(num_tokens, dim, dtype=dtype, device=y.device)
    if y.stride(-1) != 1:
        raise ValueError("combine: y needs a contiguous last dim")
    if num_tokens == 0 or dim == 0:
        return out
    ids, wts = topk_ids.contiguous(), topk_weights.contiguous()
    grid = (num_tokens, triton.cdiv(dim, COMBINE_BLOCK_D))
    _combine_kernel[grid](
        y, ids, wts, out, dim, y.stride(0), y.stride(1), out.stride(0),
        TOPK=topk, BLOCK_K=_pow2(topk), BLOCK_D=COMBINE_BLOCK_D,
    )  # fmt: skip
    return out


def _pow2(n: int) -> int:
    return max(2, triton.next_power_of_2(n))
