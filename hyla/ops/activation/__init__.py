"""Activation ops. See `reference.py`; CUDA tensors go to the Triton kernel of `kernels.py`
(imported on first use, so CPU installs never import triton); tensors that need gradients, and
everything else, to the reference."""

from __future__ import annotations

import torch

from hyla.ops.activation import reference
from hyla.ops.gpu import use_triton

__all__ = ["silu_and_mul"]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:]: [..., 2I] -> [..., I] in x's dtype; see
    `reference.silu_and_mul` (errors as there)."""
    needs_grad = torch.is_grad_enabled() and x.requires_grad
    if use_triton(x) and not needs_grad and x.stride(-1) == 1 and x.shape[-1] % 2 == 0:
        from hyla.ops.activation import kernels

        return kernels.silu_and_mul(x)
    return reference.silu_and_mul(x)
