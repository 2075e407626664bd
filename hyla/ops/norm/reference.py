"""RMSNorm (Zhang & Sennrich 2019), computed in fp32 and cast back to the input dtype."""

from __future__ import annotations

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
) -> torch.Tensor:
    """`x / sqrt(mean(x^2) + eps) * (offset + weight)` over the last dim.

    Args:
        x: [..., D] any float dtype.
        weight: [D].
        eps: added to the mean square.
        offset: 1.0 for zero-centred weights (Qwen3-Next `Qwen3NextRMSNorm`), else 0.0.
    Returns: [..., D] in x's dtype.
    """
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (xf * (offset + weight.float())).to(dtype)
    return weight * xf.to(dtype)
