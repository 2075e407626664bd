"""SwiGLU's activation on a stacked gate/up projection (Shazeer 2020, "GLU Variants Improve
Transformer"; the MLPs of every supported family):

    silu_and_mul(x) = silu(x[..., :I]) * x[..., I:]         x: [..., 2I] -> [..., I]

rounded as PyTorch rounds `F.silu(gate) * up` (silu in fp32, rounded to x's dtype, then the
product in fp32, rounded again). GLM-5.3-Flash clamps both halves first (`swiglu_limit` L):

    silu_and_mul_clamped(x, L) = silu(min(gate, L)) * clamp(up, -L, L)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2I] (gate columns, then up columns) -> [..., I] in x's dtype.

    Raises: ValueError when the last dim is odd."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim must be even (gate | up), got {x.shape[-1]}")
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul_clamped(x: torch.Tensor, limit: float) -> torch.Tensor:
    """`silu_and_mul` with the gate clamped above at `limit` and up to [-limit, limit]
    (transformers' `Glm5NextTextMLP` / `Glm5NextTextExperts._apply_gate`)."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim must be even (gate | up), got {x.shape[-1]}")
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
