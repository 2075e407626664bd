"""RMSNorm variants (`reference.py`); CUDA tensors go to the Triton kernels, imported on use."""

from __future__ import annotations

import torch

from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.norm import reference
from hyla.ops.norm.reference import rms_norm_unweighted

__all__ = ["fused_add_rms_norm", "gated_rms_norm", "rms_norm", "rms_norm_unweighted"]


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
) -> torch.Tensor:
    """`x / sqrt(mean(x^2) + eps) * (offset + weight)` over the last dim (`reference.rms_norm`)."""
    if use_triton(x):
        from hyla.ops.norm import kernels

        if kernels.supports(x, weight):
            return kernels.rms_norm(x, weight, eps, offset)
    return reference.rms_norm(x, weight, eps, offset)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`h = x + residual; return rms_norm(h), h` (`reference.fused_add_rms_norm`)."""
    if use_triton(x):
        from hyla.ops.norm import kernels

        if kernels.supports(x, weight, residual):
            return kernels.fused_add_rms_norm(x, residual, weight, eps, offset)
    return reference.fused_add_rms_norm(x, residual, weight, eps, offset)


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    activation: str = "silu",
    weight_in_fp32: bool = False,
) -> torch.Tensor:
    """RMSNorm of x times `act(gate)` (`reference.gated_rms_norm`)."""
    if use_triton(x) and not needs_grad(x, gate, weight):
        from hyla.ops.norm import gated_kernels

        if gated_kernels.supports(x, gate, weight, weight_in_fp32):
            return gated_kernels.gated_rms_norm(x, gate, weight, eps, activation, weight_in_fp32)
    return reference.gated_rms_norm(x, gate, weight, eps, activation, weight_in_fp32)
