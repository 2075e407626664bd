"""Triton gated RMSNorm (KDA / Gated DeltaNet output norm), one program per row; same casts as
`reference.gated_rms_norm`, differing only in sum order and rsqrt/exp last-bit rounding."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.norm.kernels import MAX_FUSED_DIM

ACTIVATIONS = {"sigmoid": 0, "silu": 1}
# no float64: the kernel computes in fp32, the reference would keep float64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _gated_rms_norm_kernel(
    x_ptr,
    g_ptr,
    w_ptr,
    y_ptr,
    stride_x,
    stride_g,
    stride_y,
    D,
    eps,
    WEIGHT_IN_FP32: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    dtype = y_ptr.dtype.element_ty
    xf = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / D
    xf = xf * (1.0 / tl.sqrt(mean_sq + eps))
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_IN_FP32:
        normed = w * xf
    else:  # as the reference: the product rounded to dtype
        normed = (w * xf.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    act = 1.0 / (1.0 + tl.exp(-g))
    if SILU:
        act = g * act
    tl.store(y_ptr + row * stride_y + cols, (normed * act).to(dtype), mask=mask)


def supports(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, weight_in_fp32: bool
) -> bool:
    """True when the kernel reproduces the reference for these arguments."""
    return (
        x.dtype in DTYPES
        and gate.shape == x.shape
        and weight.dim() == 1
        and weight.shape[0] == x.shape[-1]
        and (weight_in_fp32 or weight.dtype == x.dtype)
        and 0 < x.shape[-1] <= MAX_FUSED_DIM
        and x.stride(-1) == 1
        and gate.stride(-1) == 1
    )


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    activation: str = "silu",
    weight_in_fp32: bool = False,
) -> torch.Tensor:
    """`reference.gated_rms_norm` in one Triton kernel; check `supports` first."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} not in {sorted(ACTIVATIONS)}")
    shape, D = x.shape, x.shape[-1]
    x2, g2 = x.reshape(-1, D), gate.reshape(-1, D)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(D)
        _gated_rms_norm_kernel[(x2.shape[0],)](
            x2, g2, weight.contiguous(), y, x2.stride(0), g2.stride(0), y.stride(0), D,
            float(eps), WEIGHT_IN_FP32=weight_in_fp32, SILU=activation == "silu",
            BLOCK_D=block, num_warps=min(max(block // 256, 1), 16),
        )  # fmt: skip
    return y.view(shape)
