"""Activation ops. See `reference.py`; CUDA tensors go to the Triton kernel of `kernels.py`
(imported on first use, so CPU installs never import triton); tensors that need gradients, and
everything else, to the reference."""

from __future__ import annotations

import torch

from hyla.ops.activation import reference
from hyla.ops.gpu import needs_grad, use_triton

__all__ = ["silu_and_mul", "silu_and_mul_clamped"]

# x dtypes the kernel reproduces: it computes in fp32, so float64 would lose precision.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def kernel_supports(x: torch.Tensor) -> bool:
    """True when the Triton kernel reproduces the reference for x (device aside): fp32 / bf16 /
    fp16, an even, non-empty, unit-stride last dim."""
    width = x.shape[-1] if x.dim() else 0
    return x.dtype in KERNEL_DTYPES and width > 0 and width % 2 == 0 and x.stride(-1) == 1


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:]: [..., 2I] -> [..., I] in x's dtype; see
    `reference.silu_and_mul` (errors as there)."""
    if use_triton(x) and not needs_grad(x) and kernel_supports(x):
        from hyla.ops.activation import kernels

        return kernels.silu_and_mul(x)
    return reference.silu_and_mul(x)


def silu_and_mul_clamped(x: torch.Tensor, limit: float) -> torch.Tensor:
    """`reference.silu_and_mul_clamped` ([..., 2I] -> [..., I]): the `silu_and_mul` kernel
    with its clamp on CUDA."""
    if use_triton(x) and not needs_grad(x) and kernel_supports(x):
        from hyla.ops.activation import kernels

        return kernels.silu_and_mul(x, limit)
    return reference.silu_and_mul_clamped(x, limit)
