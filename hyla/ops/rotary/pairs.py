"""DeepSeek-V4 rope (transformers `deepseek_v4`): adjacent pairs of the trailing R channels,
output kept interleaved (unlike `apply_rope`'s "interleave", which de-interleaves)."""

from __future__ import annotations

import torch


def apply_rope_pairs_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the last R channels of x [T, H, D] or [T, D] in pairs (fp32); cos, sin: [T, R/2]."""
    half = cos.shape[-1]
    heads = x if x.dim() == 3 else x[:, None]
    rest, rot = heads[..., : -2 * half], heads[..., -2 * half :].float()
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    even, odd = rot[..., 0::2], rot[..., 1::2]
    rotated = torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(-2)
    out = torch.cat([rest, rotated.to(x.dtype)], dim=-1)
    return out if x.dim() == 3 else out[:, 0]
