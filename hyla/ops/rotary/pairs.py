"""DeepSeek-V4's rope: adjacent channel pairs (2i, 2i + 1) rotated in place on the *trailing*
`R` channels of each head ([nope | rope] layout), as transformers' `deepseek_v4`
`apply_rotary_pos_emb`; the output keeps the pairs interleaved (unlike `apply_rope`'s
"interleave" style, which de-interleaves as DeepSeek-V3's does). V4 reads the rotated tokens
as values too, and undoes the rotation on the attention output with -sin.
"""

from __future__ import annotations

import torch


def apply_rope_pairs_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the last `R = 2 * cos.shape[-1]` channels of each head in adjacent pairs.

    Args:
        x: [T, H, D] (or [T, D]: one head); cos, sin: [T, R/2] from `rope_cos_sin`.
    Returns: x's shape and dtype; the rotation runs in float32.
    """
    half = cos.shape[-1]
    heads = x if x.dim() == 3 else x[:, None]
    rest, rot = heads[..., : -2 * half], heads[..., -2 * half :].float()
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    even, odd = rot[..., 0::2], rot[..., 1::2]
    rotated = torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(-2)
    out = torch.cat([rest, rotated.to(x.dtype)], dim=-1)
    return out if x.dim() == 3 else out[:, 0]
