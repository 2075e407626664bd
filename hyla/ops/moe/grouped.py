"""Triton grouped-GEMM routed experts: pairs sorted by expert on the device (no host sync), then
gate_up, down and combine launches. `align`'s layout (-- = P: no pair; -1: past the last):

    sorted_pairs  | e0: p3 p9 -- -- | e2: p0 p4 p5 p8 | e2: p11 -- -- -- | ...
    block_expert  |       0         |        2        |        2         | -1 ...
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 64


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, pairs_ptr, block_expert_ptr, h_ptr,
    P, D, I,
    stride_xt, stride_xd, stride_we, stride_wn, stride_wd, stride_hp, stride_hi, limit,
    TOPK: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CLAMP: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    e = tl.load(block_expert_ptr + block).to(tl.int64)
    if e < 0:
        return
    pairs = tl.load(pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = pairs < P
    tokens = pairs // TOPK
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < I
    w_rows = w_ptr + e * stride_we + cols[None, :] * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < D
        a = tl.load(
            x_ptr + tokens[:, None] * stride_xt + ks[None, :] * stride_xd,
            mask=valid[:, None] & k_ok[None, :], other=0.0,
        )  # fmt: skip
        w_mask = k_ok[:, None] & col_ok[None, :]
        wg = tl.load(w_rows + ks[:, None] * stride_wd, mask=w_mask, other=0.0)
        wu = tl.load(w_rows + I * stride_wn + ks[:, None] * stride_wd, mask=w_mask, other=0.0)
        acc_g = tl.dot(a, wg, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, wu, acc_u, input_precision=PRECISION)
    out_ty = h_ptr.dtype.element_ty
    gate = acc_g.to(out_ty).to(tl.float32)
    up = acc_u.to(out_ty).to(tl.float32)
    if CLAMP:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ty).to(tl.float32)  # F.silu rounds
    tl.store(
        h_ptr + pairs[:, None] * stride_hp + cols[None, :] * stride_hi,
        (act * up).to(out_ty), mask=valid[:, None] & col_ok[None, :],
    )  # fmt: skip


@triton.jit
def _down_kernel(
    h_ptr, w_ptr, pairs_ptr, block_expert_ptr, weights_ptr, y_ptr,
    P, D, I,
    stride_hp, stride_hi, stride_we, stride_wn, stride_wi, stride_yp, stride_yd,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    e = tl.load(block_expert_ptr + block).to(tl.int64)
    if e < 0:
        return
    pairs = tl.load(pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = pairs < P
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < D
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < I
        a = tl.load(
            h_ptr + pairs[:, None] * stride_hp + ks[None, :] * stride_hi,
            mask=valid[:, None] & k_ok[None, :], other=0.0,
        )  # fmt: skip
        b = tl.load(
            w_ptr + e * stride_we + cols[None, :] * stride_wn + ks[:, None] * stride_wi,
            mask=k_ok[:, None] & col_ok[None, :], other=0.0,
        )  # fmt: skip
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    out_ty = y_ptr.dtype.element_ty
    w = tl.load(weights_ptr + pairs, mask=valid, other=0.0).to(tl.float32)
    y = acc.to(out_ty).to(tl.float32) * w[:, None]
    tl.store(
        y_ptr + pairs[:, None] * stride_yp + cols[None, :] * stride_yd,
        y.to(out_ty), mask=valid[:, None] & col_ok[None, :],
    )  # fmt: skip


@triton.jit
def _combine_kernel(
    y_ptr, order_ptr, out_ptr, D, stride_yp, stride_ot,
    TOPK: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = cols < D
    out_ty = out_ptr.dtype.element_ty
    first = tl.load(order_ptr + t * TOPK).to(tl.int64)
    acc = tl.load(y_ptr + (t * TOPK + first) * stride_yp + cols, mask=ok, other=0.0)
    for r in tl.static_range(1, TOPK):
        slot = tl.load(order_ptr + t * TOPK + r).to(tl.int64)
        term = tl.load(y_ptr + (t * TOPK + slot) * stride_yp + cols, mask=ok, other=0.0)
        acc = (acc.to(tl.float32) + term.to(tl.float32)).to(out_ty)
    tl.store(out_ptr + t * stride_ot + cols, acc, mask=ok)


def align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M
) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (sorted_pairs [num_blocks * block_m], block_expert [num_blocks]) with
    num_blocks = cdiv(P, block_m) + E, no host sync."""
    flat = topk_ids.reshape(-1)
    P, device = flat.numel(), flat.device
    num_blocks = triton.cdiv(P, block_m) + num_experts
    # scatter_add, not bincount: bincount reads the maximum back to size its result (a sync)
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    blocks_per = (counts + block_m - 1) // block_m
    block_end = blocks_per.cumsum(0)
    order = torch.argsort(flat, stable=True)
    sorted_ids = flat.index_select(0, order)
    first_pair = counts.cumsum(0) - counts
    rank = torch.arange(P, device=device) - first_pair.index_select(0, sorted_ids)
    dest = (block_end - blocks_per).index_select(0, sorted_ids) * block_m + rank
    sorted_pairs = torch.full((num_blocks * block_m,), P, dtype=torch.long, device=device)
    sorted_pairs.index_copy_(0, dest, order)
    blocks = torch.arange(num_blocks, device=device)
    block_expert = torch.searchsorted(block_end, blocks, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_pairs, block_expert


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def moe_experts(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    packed: tuple | None = None,
    limit: float | None = None,
) -> torch.Tensor:
    """`reference.moe_experts` (ids distinct per row; `packed` unused); `limit`: clamped SwiGLU."""
    del packed
    T, k = topk_ids.shape
    num_experts, two_i, D = gate_up_proj.shape
    inter, P, dtype = two_i // 2, T * k, hidden_states.dtype
    if P == 0:
        return torch.zeros_like(hidden_states)
    sorted_pairs, block_expert = align(topk_ids, num_experts)
    num_blocks = block_expert.numel()
    x, w1, w2 = hidden_states, gate_up_proj, down_proj
    h = torch.empty(P, inter, dtype=dtype, device=x.device)
    bn, bk, prec = 64, 64, _precision(dtype)
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, bn))](
        x, w1, sorted_pairs, block_expert, h, P, D, inter,
        x.stride(0), x.stride(1), w1.stride(0), w1.stride(1), w1.stride(2),
        h.stride(0), h.stride(1), 0.0 if limit is None else float(limit),
        TOPK=k, PRECISION=prec, BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_K=bk, CLAMP=limit is not None,
        num_warps=4, num_stages=3,
    )  # fmt: skip
    y = torch.empty(P, D, dtype=dtype, device=x.device)
    weights = topk_weights.reshape(-1)
    bn_down = 128 if D >= 128 else 64
    _down_kernel[(num_blocks, triton.cdiv(D, bn_down))](
        h, w2, sorted_pairs, block_expert, weights, y, P, D, inter,
        h.stride(0), h.stride(1), w2.stride(0), w2.stride(1), w2.stride(2),
        y.stride(0), y.stride(1),
        PRECISION=prec, BLOCK_M=BLOCK_M, BLOCK_N=bn_down, BLOCK_K=bk,
        num_warps=4, num_stages=3,
    )  # fmt: skip
    order = topk_ids.argsort(dim=1).contiguous()
    out = torch.empty(T, D, dtype=dtype, device=x.device)
    block_d = min(1024, triton.next_power_of_2(D))
    _combine_kernel[(T, triton.cdiv(D, block_d))](
        y, order, out, D, y.stride(0), out.stride(0), TOPK=k, BLOCK_D=block_d, num_warps=4
    )
    return out
