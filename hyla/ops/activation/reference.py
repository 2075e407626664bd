"""SwiGLU's activation (Shazeer 2020) on a stacked gate/up projection: silu(x[..., :I]) *
x[..., I:], rounded as PyTorch rounds `F.silu(gate) * up`."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2I] (gate | up) -> [..., I] in x's dtype."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim must be even (gate | up), got {x.shape[-1]}")
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul_clamped(x: torch.Tensor, limit: float) -> torch.Tensor:
    """GLM-5.3-Flash's `silu(min(gate, L)) * clamp(up, -L, L)` (transformers' Glm5NextTextMLP)."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim must be even (gate | up), got {x.shape[-1]}")
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
