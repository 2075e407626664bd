"""Block-diagonal grouped linear (DeepSeek-V4's grouped low-rank output projection `o_a_proj`,
transformers' `DeepseekV4GroupedLinear`): the heads' outputs split into G groups, each group
projected by its own [Dout, Din] block of one stored weight [G * Dout, Din]."""

from __future__ import annotations

import torch


def grouped_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, G, Din], weight [G * Dout, Din] -> [T, G, Dout] (group g uses rows g*Dout ..)."""
    num_groups = x.shape[1]
    w = weight.view(num_groups, -1, weight.shape[-1])  # [G, Dout, Din]
    return torch.einsum("tgi,goi->tgo", x, w.to(x.dtype))
