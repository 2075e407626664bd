"""Block-diagonal grouped linear (DeepSeek-V4's `o_a_proj`, `DeepseekV4GroupedLinear`)."""

from __future__ import annotations

import torch


def grouped_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, G, Din], weight [G * Dout, Din] -> [T, G, Dout] (group g uses rows g*Dout ..)."""
    num_groups = x.shape[1]
    w = weight.view(num_groups, -1, weight.shape[-1])
    return torch.einsum("tgi,goi->tgo", x, w.to(x.dtype))
