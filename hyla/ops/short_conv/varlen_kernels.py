"""Short conv of a packed step in two Triton launches; the state update runs after the conv
launch, so no conv program reads an overwritten slot. Numerics as `cpu.causal_conv1d`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.short_conv.kernels import _ACTIVATION_CODES, check_slot_inputs

BLOCK_T = 16
BLOCK_C = 128


@triton.jit
def _conv_varlen_kernel(
    x_ptr, w_ptr, b_ptr, pool_ptr, idx_ptr, has_state_ptr, cu_ptr, seq_ptr, y_ptr,
    T, C,
    stride_x_t, stride_x_c, stride_w_c, stride_w_w,
    stride_p_s, stride_p_c, stride_p_w, stride_y_t, stride_b,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = rows < T
    col_ok = cols < C
    mask = row_ok[:, None] & col_ok[None, :]
    seq = tl.load(seq_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    pos = rows - tl.load(cu_ptr + seq, mask=row_ok, other=0).to(tl.int64)
    slot = tl.load(idx_ptr + seq, mask=row_ok, other=0).to(tl.int64)
    carried = tl.load(has_state_ptr + seq, mask=row_ok, other=0).to(tl.int32) != 0
    rows64 = rows.to(tl.int64)
    w_cols = w_ptr + cols * stride_w_c
    x_cur = tl.load(x_ptr + rows64[:, None] * stride_x_t + cols[None, :] * stride_x_c, mask=mask)
    w_last = tl.load(w_cols + (W - 1) * stride_w_w, mask=col_ok, other=0.0).to(tl.float32)
    y = x_cur.to(tl.float32) * w_last[None, :]
    for j in tl.static_range(W - 1):
        back = W - 1 - j
        inside = pos >= back
        x_tap = tl.load(
            x_ptr + (rows64 - back)[:, None] * stride_x_t + cols[None, :] * stride_x_c,
            mask=mask & inside[:, None], other=0.0,
        ).to(tl.float32)  # fmt: skip
        s_col = W - 1 - back + pos
        s_mask = mask & (~inside & carried)[:, None]
        s_tap = tl.load(
            pool_ptr + slot[:, None] * stride_p_s + cols[None, :] * stride_p_c
            + s_col[:, None] * stride_p_w,
            mask=s_mask, other=0.0,
        ).to(tl.float32)  # fmt: skip
        tap = tl.where(inside[:, None], x_tap, s_tap)
        wj = tl.load(w_cols + j * stride_w_w, mask=col_ok, other=0.0).to(tl.float32)
        y = tl.fma(tap, wj[None, :], y)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols * stride_b, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION == 1:
        y = y / (1.0 + tl.exp(-y))
    elif ACTIVATION == 2:
        y = 1.0 / (1.0 + tl.exp(-y))
    tl.store(
        y_ptr + rows64[:, None] * stride_y_t + cols[None, :], y.to(y_ptr.dtype.element_ty),
        mask=mask,
    )  # fmt: skip


@triton.jit
def _state_varlen_kernel(
    x_ptr, pool_ptr, idx_ptr, has_state_ptr, cu_ptr,
    C, stride_x_t, stride_x_c, stride_p_s, stride_p_c, stride_p_w,
    W: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    start = tl.load(cu_ptr + i).to(tl.int64)
    length = tl.load(cu_ptr + i + 1).to(tl.int64) - start
    slot = tl.load(idx_ptr + i).to(tl.int64)
    carried = tl.load(has_state_ptr + i).to(tl.int32)
    state_ptrs = pool_ptr + slot * stride_p_s + cols * stride_p_c
    # ascending j: entry j is written after its read of entry length + j >= j
    for j in tl.static_range(W - 1):
        e = length + j
        from_x = (tl.zeros_like(cols) + e) >= W - 1  # per column: masks must be blocks
        from_state = (tl.zeros_like(cols) + e < W - 1) & (tl.zeros_like(cols) + carried != 0)
        xv = tl.load(
            x_ptr + (start + e - (W - 1)) * stride_x_t + cols * stride_x_c,
            mask=col_ok & from_x, other=0.0,
        ).to(tl.float32)  # fmt: skip
        sv = tl.load(
            state_ptrs + tl.minimum(e, W - 2) * stride_p_w,
            mask=col_ok & from_state, other=0.0,
        ).to(tl.float32)  # fmt: skip
        new = tl.where(from_x, xv, sv)
        tl.store(state_ptrs + j * stride_p_w, new.to(pool_ptr.dtype.element_ty), mask=col_ok)


def conv_varlen_slots(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_pool: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Packed sequences through the short conv, states read from and written to their pool
    slots. x: [T, C]; cu_seqlens: [N + 1]; conv_pool: [S, C, W - 1]; state_indices: [N];
    has_initial_state: [N], False reads zeros instead of the slot. Returns y [T, C]."""
    T, C = x.shape
    N = state_indices.shape[0]
    check_slot_inputs(x.new_empty(N, C), weight, bias, conv_pool, state_indices, activation)
    if tuple(cu_seqlens.shape) != (N + 1,):
        raise ValueError(f"cu_seqlens: shape {tuple(cu_seqlens.shape)}, expected ({N + 1},)")
    if tuple(has_initial_state.shape) != (N,):
        raise ValueError(
            f"has_initial_state: shape {tuple(has_initial_state.shape)}, expected ({N},)"
        )
    W = weight.shape[1]
    cu_seqlens, state_indices = cu_seqlens.contiguous(), state_indices.contiguous()
    has_initial_state = has_initial_state.contiguous()
    y = torch.empty(T, C, dtype=x.dtype, device=x.device)
    if N == 0 or C == 0:
        return y
    if T > 0:
        tokens = torch.arange(T, device=x.device, dtype=cu_seqlens.dtype)
        seq_ids = torch.searchsorted(cu_seqlens[1:].contiguous(), tokens, right=True)
        _conv_varlen_kernel[(triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C))](
            x, weight, bias if bias is not None else weight, conv_pool, state_indices,
            has_initial_state, cu_seqlens, seq_ids, y, T, C,
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
            conv_pool.stride(0), conv_pool.stride(1), conv_pool.stride(2), y.stride(0),
            bias.stride(0) if bias is not None else 0,
            W=W, HAS_BIAS=bias is not None, ACTIVATION=_ACTIVATION_CODES[activation],
            BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=4,
        )  # fmt: skip
    _state_varlen_kernel[(N, triton.cdiv(C, BLOCK_C))](
        x, conv_pool, state_indices, has_initial_state, cu_seqlens, C,
        x.stride(0), x.stride(1), conv_pool.stride(0), conv_pool.stride(1), conv_pool.stride(2),
        W=W, BLOCK_C=BLOCK_C, num_warps=4,
    )  # fmt: skip
    return y
