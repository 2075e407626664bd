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
    """`reference.linear`: x [..., D_in], weight [D_out, D_in], bias [D_out] or None ->
    [..., D_out] in x's dtype (the GEMV's fp32 sums may differ from cuBLAS's in order only)."""
    if bias is None and use_triton(x) and x.numel() <= GEMV_ROWS * x.shape[-1]:
        from hyla.ops.linear import gemv

        if gemv.supports(x, weight) and not needs_grad(x, weight):
            return gemv.gemv(x, weight)
    return reference.linear(x, weight, bias)
