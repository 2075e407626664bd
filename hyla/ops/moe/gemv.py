"""Routed experts for a few tokens on CUDA (Triton): each (token, slot) pair's expert matrices are
read in place from the fused [E, ...] weights by two GEMV kernels, with no copy of the experts
(the PyTorch form `kernels._gathered` copies each pair's matrices with `index_select` first,
moving them three times) and the weighted sum fused into the second kernel.

    kernel 1, program (pair p = t * k + j, rows i0 .. i0 + BLOCK_I of I):
        g = W_gate[e] x_t, u = W_up[e] x_t      (fp32 sums, each rounded to the hidden dtype)
        h[p] = silu(g) * up                     (rounded as PyTorch rounds each op)
    kernel 2, program (token t, columns d0 .. d0 + BLOCK_D of D):
        for the token's experts in ascending id order:  y = W_down[e] h[p]  (rounded)
            out = out + round(w_p * y)          (each add rounded: `kernels._weighted_sum`)

Same arguments and results as `kernels.moe_experts` (`reference.moe_experts` to rounding of the
fp32 sums); `kernels._gathered` + `kernels._weighted_sum` is the readable definition, and
tests/gpu/test_moe_gpu.py holds them together. No host sync: capturable in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_I = 16  # rows of the gate/up projection per program
BLOCK_D_DOWN = 16  # output columns per program of the down projection
BLOCK_K_RED = 256  # reduction chunk (D for gate/up, I for down)


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    ids_ptr,
    h_ptr,
    D,
    I,
    stride_xt,
    stride_we,
    stride_wr,
    stride_hp,
    TOPK: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)
    pid_i = tl.program_id(1)
    t = p // TOPK
    e = tl.load(ids_ptr + p).to(tl.int64)
    offs_i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < I
    w_gate = w_ptr + e * stride_we + offs_i[:, None].to(tl.int64) * stride_wr
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
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(h_ptr + p * stride_hp + offs_i, (s * u).to(dtype), mask=mask_i)


@triton.jit
def _down_sum_kernel(
    h_ptr,
    w_ptr,
    ids_ptr,
    wts_ptr,
    out_ptr,
    D,
    I,
    stride_hp,
    stride_we,
    stride_wr,
    stride_ot,
    TOPK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < TOPK
    ids = tl.load(ids_ptr + t * TOPK + offs_k, mask=mask_k, other=1 << 30)
    wts = tl.load(wts_ptr + t * TOPK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    rank = tl.sum((ids[None, :] < ids[:, None]).to(tl.int32), axis=1)  # ids are distinct
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    dtype = out_ptr.dtype.element_ty
    out = tl.zeros([BLOCK_D], tl.float32)
    for r in tl.static_range(TOPK):  # ascending expert id, as the reference sums
        sel = rank == r
        j = tl.sum(tl.where(sel, offs_k, 0), axis=0).to(tl.int64)
        e = tl.sum(tl.where(sel, ids, 0), axis=0).to(tl.int64)
        w = tl.sum(tl.where(sel, wts, 0.0), axis=0)
        w_rows = w_ptr + e * stride_we + offs_d[:, None].to(tl.int64) * stride_wr
        acc = tl.zeros([BLOCK_D], tl.float32)
        for i0 in range(0, I, BLOCK_I):
            offs_i = i0 + tl.arange(0, BLOCK_I)
            mask_i = offs_i < I
            h = tl.load(h_ptr + (t * TOPK + j) * stride_hp + offs_i, mask=mask_i, other=0.0)
            mask = mask_d[:, None] & mask_i[None, :]
            wd = tl.load(w_rows + offs_i[None, :], mask=mask, other=0.0)
            acc += tl.sum(wd.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
        term = (acc.to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)
        if r == 0:
            out = term
        else:
            out = (out + term).to(dtype).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + offs_d, out.to(dtype), mask=mask_d)


def moe_gemv(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Routed experts of T tokens, experts read in place (see the module docstring).

    Shapes: hidden_states [T, D]; gate_up_proj [E, 2I, D]; down_proj [E, D, I] (last dims
    contiguous); topk_weights [T, k] float; topk_ids [T, k] int, distinct within a row.
    Returns: [T, D] in hidden_states' dtype.
    """
    num_tokens, topk = topk_ids.shape
    inter, dim = down_proj.shape[2], hidden_states.shape[1]
    out = hidden_states.new_empty(num_tokens, dim)
    if num_tokens == 0:
        return out
    if gate_up_proj.stride(-1) != 1 or down_proj.stride(-1) != 1:
        raise ValueError("moe_gemv: expert weights need a contiguous last dim")
    x = hidden_states.contiguous()
    ids = topk_ids.contiguous()
    wts = topk_weights.contiguous()
    h = hidden_states.new_empty(num_tokens * topk, inter)
    _gate_up_kernel[(num_tokens * topk, triton.cdiv(inter, BLOCK_I))](
        x, gate_up_proj, ids, h, dim, inter,
        x.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1), h.stride(0),
        TOPK=topk, BLOCK_I=BLOCK_I, BLOCK_D=BLOCK_K_RED, num_warps=4,
    )  # fmt: skip
    _down_sum_kernel[(num_tokens, triton.cdiv(dim, BLOCK_D_DOWN))](
        h, down_proj, ids, wts, out, dim, inter,
        h.stride(0), down_proj.stride(0), down_proj.stride(1), out.stride(0),
        TOPK=topk, BLOCK_K=max(2, triton.next_power_of_2(topk)), BLOCK_D=BLOCK_D_DOWN,
        BLOCK_I=BLOCK_K_RED, num_warps=4,
    )  # fmt: skip
    return out
