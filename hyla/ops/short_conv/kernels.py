"""Short-conv decode step in one Triton kernel: each sequence's state is read from its slot
of a pool and the shifted state written back in place. Same numerics as `cpu.causal_conv1d`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.short_conv.reference import ACTIVATIONS

MAX_BLOCK_C = 512


@triton.jit
def _conv_update_slots_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    pool_ptr,
    idx_ptr,
    y_ptr,
    C,
    stride_x_n,
    stride_x_c,
    stride_w_c,
    stride_w_w,
    stride_p_s,
    stride_p_c,
    stride_p_w,
    stride_y_n,
    stride_b,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < C
    slot = tl.load(idx_ptr + n).to(tl.int64)
    state_ptrs = pool_ptr + slot * stride_p_s + cols * stride_p_c
    w_ptrs = w_ptr + cols * stride_w_c
    x = tl.load(x_ptr + n * stride_x_n + cols * stride_x_c, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    y = xf * tl.load(w_ptrs + (W - 1) * stride_w_w, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(W - 1):
        s = tl.load(state_ptrs + j * stride_p_w, mask=mask, other=0.0).to(tl.float32)
        wj = tl.load(w_ptrs + j * stride_w_w, mask=mask, other=0.0).to(tl.float32)
        y = tl.fma(s, wj, y)  # addcmul_ rounds once, as an fma
        if j > 0:  # read before written: same program, same columns
            tl.store(state_ptrs + (j - 1) * stride_p_w, s.to(pool_ptr.dtype.element_ty), mask=mask)
    tl.store(state_ptrs + (W - 2) * stride_p_w, xf.to(pool_ptr.dtype.element_ty), mask=mask)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols * stride_b, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == 1:
        y = y / (1.0 + tl.exp(-y))
    elif ACTIVATION == 2:
        y = 1.0 / (1.0 + tl.exp(-y))
    tl.store(y_ptr + n * stride_y_n + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


_ACTIVATION_CODES = {None: 0, "silu": 1, "sigmoid": 2}


def check_slot_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_pool: torch.Tensor,
    state_indices: torch.Tensor,
    activation: str | None,
) -> None:
    if x.dim() != 2:
        raise ValueError(f"x: shape {tuple(x.shape)}, expected [N, C]")
    N, C = x.shape
    if weight.dim() != 2 or weight.shape[0] != C or weight.shape[1] < 2:
        raise ValueError(f"weight: shape {tuple(weight.shape)}, expected [{C}, W >= 2]")
    W = weight.shape[1]
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"bias: shape {tuple(bias.shape)} != {(C,)}")
    if conv_pool.dim() != 3 or tuple(conv_pool.shape[1:]) != (C, W - 1):
        raise ValueError(f"conv_pool: shape {tuple(conv_pool.shape)}, expected [S, {C}, {W - 1}]")
    if tuple(state_indices.shape) != (N,) or state_indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"state_indices: {state_indices.dtype} {tuple(state_indices.shape)}, expected int [{N}]"
        )
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} not in {sorted(ACTIVATIONS)} or None")


def conv_update_slots(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_pool: torch.Tensor,
    state_indices: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One decode token per sequence, states updated in their pool slots (graph capturable).
    x: [N, C]; weight: [C, W]; conv_pool: [S, C, W - 1]; state_indices: [N], distinct.
    Returns y [N, C] in x's dtype."""
    check_slot_inputs(x, weight, bias, conv_pool, state_indices, activation)
    N, C = x.shape
    W = weight.shape[1]
    y = torch.empty(N, C, dtype=x.dtype, device=x.device)
    if N == 0 or C == 0:
        return y
    block_c = min(MAX_BLOCK_C, max(16, triton.next_power_of_2(C)))
    grid = (N, triton.cdiv(C, block_c))
    _conv_update_slots_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_pool, state_indices, y,
        C,
        x.stride(0), x.stride(1),
        weight.stride(0), weight.stride(1),
        conv_pool.stride(0), conv_pool.stride(1), conv_pool.stride(2),
        y.stride(0),
        bias.stride(0) if bias is not None else 0,
        W=W,
        HAS_BIAS=bias is not None,
        ACTIVATION=_ACTIVATION_CODES[activation],
        BLOCK_C=block_c,
        num_warps=4,
    )  # fmt: skip
    return y
