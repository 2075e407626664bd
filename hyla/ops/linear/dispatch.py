"""The linear op as the layers run it: `reference.linear` (F.linear), except one-row CUDA inputs
(a batch-1 decode step; no bias, no autograd, triton installed), which go to the Triton GEMV of
`gemv.py` (imported on first use, so CPU installs never import triton). The GEMV takes up to
`gemv.MAX_ROWS` rows, but was measured against cuBLAS at one row only (faster at every
projection shape of bench/gpu_e2e.py's model: bench/results/gpu_gemv_sweep_h200.json)."""

from __future__ import annotations

import torch

from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.linear import reference

GEMV_ROWS = 1  # rows sent to the GEMV (see the module docstring)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`reference.linear`: x [..., D_in], weight [D_out, D_in] in x's dtype, bias [D_out] or
    None -> [..., D_out] in x's dtype (the GEMV's fp32 sums may differ from cuBLAS's in order
    only)."""
    if bias is None and x.dtype == weight.dtype and _gemv_takes(x, weight):
        from hyla.ops.linear import gemv

        return gemv.gemv(x, weight)
    return reference.linear(x, weight, bias)


def linear_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`reference.linear(x.float(), weight)` for a float32 weight [D_out, D_in] (router logits):
    [..., D_in] of any float dtype -> [..., D_out] float32. One-row CUDA inputs skip the cast
    kernel: the GEMV reads x's values and sums in fp32."""
    if weight.dtype == torch.float32 and _gemv_takes(x, weight):
        from hyla.ops.linear import gemv

        return gemv.gemv(x, weight)
    return reference.linear(x.float(), weight)


def _gemv_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if not (use_triton(x) and x.numel() <= GEMV_ROWS * x.shape[-1]) or needs_grad(x, weight):
        return False
    from hyla.ops.linear import gemv

    return gemv.supports(x, weight)
