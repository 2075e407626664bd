"""Linear projection, the definition: `F.linear` (x @ W^T + b), computed by torch's CPU BLAS."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., D_in]; weight: [D_out, D_in]; bias: [D_out] or None -> [..., D_out]."""
    return F.linear(x, weight, bias)
