"""RMSNorm (Zhang & Sennrich 2019), computed in fp32 and cast back to the input dtype."""

from __future__ import annotations

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
) -> torch.Tensor:
    """`x / sqrt(mean(x^2) + eps) * (offset + weight)` over the last dim. x: [..., D];
    weight: [D]; offset: 1.0 for zero-centred weights (Qwen3-Next). Returns x's dtype."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (xf * (offset + weight.float())).to(dtype)
    return weight * xf.to(dtype)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`h = x + residual` (rounded to the inputs' dtype), returns `(rms_norm(h), h)` (vLLM's
    convention, out of place). x, residual: [..., D]."""
    h = residual + x
    return rms_norm(h, weight, eps, offset), h


_GATE_ACTIVATIONS = {"silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid}


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    activation: str = "silu",
    weight_in_fp32: bool = False,
) -> torch.Tensor:
    """RMSNorm of x times `act(gate)`, the gate in fp32. x, gate: [..., D]; weight: [D].
    Qwen3-Next `Qwen3NextRMSNormGated`: "silu", weight_in_fp32=False (normed x cast to x's
    dtype first); Kimi `KimiLinearRMSNormGated`: "sigmoid", weight_in_fp32=True."""
    if activation not in _GATE_ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} not in {sorted(_GATE_ACTIVATIONS)}")
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    normed = weight.float() * xf if weight_in_fp32 else weight * xf.to(dtype)
    return (normed * _GATE_ACTIVATIONS[activation](gate.float())).to(dtype)


def rms_norm_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without weight (DeepSeek-V4 `q_b_norm`): scale in fp32, product in x's dtype."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)
