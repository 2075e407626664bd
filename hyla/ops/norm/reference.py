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


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm: `h = x + residual`, returns `(rms_norm(h), h)`.

    The pre-norm decoder's `h = h + sublayer(...)` followed by the next norm, as one op (vLLM's
    `fused_add_rms_norm` convention, out of place). The add rounds to the inputs' dtype first,
    exactly as the unfused `x + residual` does.

    Args:
        x: [..., D] the sublayer output.
        residual: [..., D] the residual stream.
        weight: [D].
        eps, offset: as `rms_norm`.
    Returns: (normed [..., D], new_residual [..., D]).
    """
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
    """RMSNorm of x, times `act(gate)`: the output norm of linear-attention layers.

    Matches transformers' `Qwen3NextRMSNormGated` (activation "silu", `weight_in_fp32=False`: the
    normed x is cast to x's dtype before the weight multiplies it) and `KimiLinearRMSNormGated`
    (activation "sigmoid", `weight_in_fp32=True`: normed x times the fp32 weight, no downcast).
    In both, the gate is applied in fp32 and the result cast back to x's dtype.

    Args:
        x: [..., D] any float dtype.
        gate: [..., D] same leading shape.
        weight: [D].
        eps: added to the mean square.
        activation: "silu" or "sigmoid".
        weight_in_fp32: see above; the two only differ below fp32.
    Returns: [..., D] in x's dtype.
    Raises: ValueError for an unknown activation.
    """
    if activation not in _GATE_ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} not in {sorted(_GATE_ACTIVATIONS)}")
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    normed = weight.float() * xf if weight_in_fp32 else weight * xf.to(dtype)
    return (normed * _GATE_ACTIVATIONS[activation](gate.float())).to(dtype)


def rms_norm_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`x / sqrt(mean(x^2) + eps)` over the last dim, no weight (DeepSeek-V4's per-head
    `q_b_norm`, `DeepseekV4UnweightedRMSNorm`): the scale in float32, the product in x's
    dtype."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)
