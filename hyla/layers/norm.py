"""RMSNorm module over `hyla.ops.norm.rms_norm`."""

from __future__ import annotations

import torch
from torch import nn

from hyla.ops.norm import fused_add_rms_norm, rms_norm


class RMSNorm(nn.Module):
    """RMSNorm with weight `[D]`; `offset=1.0` for zero-centred weights (initialised to 0)."""

    def __init__(self, dim: int, eps: float = 1e-6, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        init = torch.zeros(dim) if offset else torch.ones(dim)
        self.weight = nn.Parameter(init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.offset)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed, h) with `h = x + residual`, in one op."""
        return fused_add_rms_norm(x, residual, self.weight, self.eps, self.offset)
