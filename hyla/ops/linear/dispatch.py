"""F.linear, except one-row CUDA inputs without bias or grad: the Triton GEMV."""

from __future__ import annotations

import torch

from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.linear import reference

GEMV_ROWS = 1  # the GEMV beats cuBLAS at one row; more rows were not measured


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., D_in], weight [D_out, D_in], bias [D_out] or None -> [..., D_out]."""
    if bias is None and x.dtype == weight.dtype and _gemv_takes(x, weight):
        from hyla.ops.linear import gemv

        return gemv.gemv(x, weight)
    return reference.linear(x, weight, bias)


def linear_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`linear(x.float(), weight)` for a float32 weight (router logits); the GEMV skips the cast."""
    if weight.dtype == torch.float32 and _gemv_takes(x, weight):
        from hyla.ops.linear import gemv

        return gemv.gemv(x, weight)
    return reference.linear(x.float(), weight)


def _gemv_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if not (use_triton(x) and x.numel() <= GEMV_ROWS * x.shape[-1]) or needs_grad(x, weight):
        return False
    from hyla.ops.linear import gemv

    return gemv.supports(x, weight)
