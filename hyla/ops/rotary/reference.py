"""Rotary position embedding (RoFormer) with default, linear and YaRN frequencies, bit-identical
to transformers' `modeling_rope_utils.py`. "interleave" de-interleaves its output as HF
`apply_rotary_pos_emb_interleave` does (q.k unchanged), so cached keys match HF's bit for bit."""

from __future__ import annotations

import math

import torch

from hyla.config import ROPE_SCALING_TYPES, RopeConfig

SCALING_TYPES = ROPE_SCALING_TYPES  # validated by RopeConfig; kept for direct callers


def _yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def _yarn_inv_freq(rope: RopeConfig) -> tuple[torch.Tensor, float]:
    s = rope.scaling_dict()
    dim, base = rope.rotary_dim, rope.theta
    if s.get("factor") is None or s.get("original_max_position_embeddings") is None:
        raise ValueError("rope.scaling: yarn needs 'factor' and 'original_max_position_embeddings'")
    factor = float(s["factor"])
    orig_max = s["original_max_position_embeddings"]
    attention_factor = s.get("attention_factor")
    mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_get_mscale(factor, mscale) / _yarn_get_mscale(
                factor, mscale_all_dim
            )
        else:
            attention_factor = _yarn_get_mscale(factor)
    beta_fast = s.get("beta_fast") or 32
    beta_slow = s.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(orig_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_extra = 1.0 / pos_freqs
    inv_inter = 1.0 / (factor * pos_freqs)
    inv_freq = inv_inter * (1 - extrapolation_factor) + inv_extra * extrapolation_factor
    return inv_freq, float(attention_factor)


def rope_inv_freq(rope: RopeConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim // 2] fp32, attention_factor) of a rope config.
    Raises ValueError for an unknown `scaling_type` or missing YaRN parameters."""
    if rope.scaling_type == "default":
        return _default_inv_freq(rope.theta, rope.rotary_dim), 1.0
    if rope.scaling_type == "linear":
        factor = float(rope.scaling_dict()["factor"])
        return _default_inv_freq(rope.theta, rope.rotary_dim) / factor, 1.0
    if rope.scaling_type == "yarn":
        return _yarn_inv_freq(rope)
    raise ValueError(f"rope.scaling_type: {rope.scaling_type!r} not in {SCALING_TYPES}")


def rope_softmax_mscale(rope: RopeConfig | None) -> float:
    """DeepSeek MLA's extra softmax scale under YaRN, `mscale(factor, mscale_all_dim)^2`."""
    if rope is None or rope.scaling_type == "default":
        return 1.0
    s = rope.scaling_dict()
    mscale_all_dim = s.get("mscale_all_dim", 0)
    if not mscale_all_dim:
        return 1.0
    m = _yarn_get_mscale(float(s["factor"]), mscale_all_dim)
    return m * m


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T], inv_freq [R/2] -> (cos, sin), each [T, R/2] fp32."""
    freqs = positions[:, None].float() * inv_freq.to(positions.device, torch.float32)[None, :]
    return freqs.cos() * attention_factor, freqs.sin() * attention_factor


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """Rotate the first R = 2 * cos.shape[-1] channels of x [T, H, D]; cos, sin: [T, R/2];
    style "neox" or "interleave". Raises ValueError for an unknown style or D < R."""
    half = cos.shape[-1]
    if x.shape[-1] < 2 * half:
        raise ValueError(f"apply_rope: head dim {x.shape[-1]} < rotary dim {2 * half}")
    c = cos.to(x.dtype)[:, None, :]
    s = sin.to(x.dtype)[:, None, :]
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    if style == "neox":
        x1, x2 = rot[..., :half], rot[..., half:]
    elif style == "interleave":
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        raise ValueError(f"apply_rope: style {style!r} not in ('neox', 'interleave')")
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)
