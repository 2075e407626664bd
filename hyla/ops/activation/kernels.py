"""Triton `reference.silu_and_mul`, rounded as the reference (`exp` may differ in the last bit)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, y_ptr, stride_x, stride_y, I, limit, BLOCK: tl.constexpr, CLAMP: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    dtype = y_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0).to(tl.float32)
    if CLAMP:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (s * u).to(dtype), mask=mask)


def silu_and_mul(x: torch.Tensor, limit: float | None = None) -> torch.Tensor:
    """x: [..., 2I] (gate | up, unit last stride) -> [..., I]; with `limit`, the clamped form."""
    width = x.shape[-1]
    if width % 2 or x.stride(-1) != 1:
        raise ValueError(f"silu_and_mul: need an even, unit-stride last dim, got {width} "
                         f"(stride {x.stride(-1)})")  # fmt: skip
    x2 = x.reshape(-1, width)
    inter = width // 2
    y = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    if x2.shape[0] and inter:
        grid = (x2.shape[0], triton.cdiv(inter, BLOCK))
        _silu_and_mul_kernel[grid](
            x2, y, x2.stride(0), y.stride(0), inter, 0.0 if limit is None else float(limit),
            BLOCK=BLOCK, CLAMP=limit is not None,
        )  # fmt: skip
    return y.view(*x.shape[:-1], inter)
