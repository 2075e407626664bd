"""Triton gated RMSNorm, the output norm of the KDA / Gated DeltaNet layers: one program per
row, one pass over x and gate instead of ~10 elementwise and reduction kernels.

Same signature and numerics as `reference.gated_rms_norm` (fp32 statistics, the same casts):

    xf = x * rsqrt(mean(x^2) + eps)                               fp32
    normed = w * xf                  (weight_in_fp32: w in fp32; else xf rounded to x's dtype,
                                      the product rounded to x's dtype again, as torch does)
    y = (normed * act(gate)).to(x.dtype)    act = sigmoid (Kimi-Linear) or silu (Qwen3-Next),
                                            in fp32

The only differences from the reference are the order of the fp32 sum of squares, `rsqrt`'s and
`exp`'s last-bit rounding. Imports triton at module level; `hyla.ops.norm` imports this module
only where the kernel runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.norm.kernels import MAX_FUSED_DIM

ACTIVATIONS = {"sigmoid": 0, "silu": 1}
# x dtypes the kernel reproduces: it computes in fp32, so a float64 x would lose precision the
# reference keeps (its weight product and output stay in float64).
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
    else:  # weight (x's dtype) * xf.to(dtype), the product rounded to dtype
        normed = (w * xf.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    act = 1.0 / (1.0 + tl.exp(-g))
    if SILU:
        act = g * act
    tl.store(y_ptr + row * stride_y + cols, (normed * act).to(dtype), mask=mask)


def supports(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, weight_in_fp32: bool
) -> bool:
    """True when the kernel reproduces the reference for these arguments: x in fp32 / bf16 /
    fp16, gate of x's shape, a [D] weight in x's dtype (or any float dtype with
    `weight_in_fp32`), 0 < D <= MAX_FUSED_DIM, unit stride along the last dims."""
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
    """`hyla.ops.norm.reference.gated_rms_norm` in one Triton kernel (CUDA, or TRITON_INTERPRET=1).

    Args:
        x: [..., D] float tensor, last dim contiguous.
        gate: [..., D] same shape, last dim contiguous (any float dtype).
        weight: [D]; x's dtype unless `weight_in_fp32` (check `supports` first).
        eps: added to the mean square.
        activation: "sigmoid" or "silu".
        weight_in_fp32: the reference's flag (Kimi-Linear True, Qwen3-Next False).
    Returns: [..., D] in x's dtype (a new tensor).
    Raises: ValueError for an unknown activation.
    """
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
