"""Activation ops: the Triton kernel for CUDA tensors without grad, else the reference."""

from __future__ import annotations

import torch

from hyla.ops.activation import reference
from hyla.ops.gpu import needs_grad, use_triton

__all__ = ["silu_and_mul", "silu_and_mul_clamped"]

# The kernel computes in fp32, so float64 would lose precision.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def kernel_supports(x: torch.Tensor) -> bool:
    width = x.shape[-1] if x.dim() else 0
    return x.dtype in KERNEL_DTYPES and width > 0 and width % 2 == 0 and x.stride(-1) == 1


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:]: [..., 2I] -> [..., I] in x's dtype."""
    if use_triton(x) and not needs_grad(x) and kernel_supports(x):
        from hyla.ops.activation import kernels

        return kernels.silu_and_mul(x)
    return reference.silu_and_mul(x)


def silu_and_mul_clamped(x: torch.Tensor, limit: float) -> torch.Tensor:
    """`reference.silu_and_mul_clamped`: [..., 2I] -> [..., I]."""
    if use_triton(x) and not needs_grad(x) and kernel_supports(x):
        from hyla.ops.activation import kernels

        return kernels.silu_and_mul(x, limit)
    return reference.silu_and_mul_clamped(x, limit)
