"""Multimodal RoPE (M-RoPE; Qwen2-VL section 2.1, interleaved as transformers'
`Qwen3_5TextRotaryEmbedding`): every token has three positions (t, h, w). Text tokens have the
same value in all three, so for text this is 1-D RoPE; an image's placeholders take its merged
grid coordinates offset by the position where the image starts, and the text after the image
continues from there plus the image's larger side:

    text  a b      image 2 x 3 (merged)            text c
    t     0 1      2 2 2 2 2 2                     5
    h     0 1      2 2 2 3 3 3                     5
    w     0 1      2 3 4 2 3 4                     5      (5 = 2 + max(2, 3))

Rotated pair j (of R/2) takes its angle from axis h when j % 3 == 1 and j < 3 * section[1],
from w when j % 3 == 2 and j < 3 * section[2], else from t.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def mrope_positions(
    token_types: Sequence[int], grids: Sequence[tuple[int, int, int]], merge: int
) -> tuple[torch.Tensor, int]:
    """Positions [3, L] int64 of a prompt whose token i is text (0) or an image placeholder (1),
    the images' (t, h, w) patch grids in order; and the delta (max position + 1 - L) that
    shifts the positions of every later (text) token."""
    out, pos, i, images = [], 0, 0, iter(grids)
    while i < len(token_types):
        j = i
        while j < len(token_types) and token_types[j] == token_types[i]:
            j += 1
        if token_types[i] == 0:
            out.append(torch.arange(pos, pos + j - i).expand(3, -1))
            pos += j - i
        else:
            t, h, w = next(images)
            gh, gw = h // merge, w // merge
            tt, hh, ww = torch.meshgrid(
                torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij"
            )
            out.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)
            pos += max(gh, gw)
        i = j
    positions = torch.cat(out, dim=1)
    return positions, int(positions.max()) + 1 - len(token_types)


def mrope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    section: Sequence[int],
    attention_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [3, T] (t, h, w) -> (cos, sin), each [T, R/2] float32 (`rope_cos_sin`'s
    layout), each pair's angle from its axis (module docstring)."""
    freqs = positions[..., None].float() * inv_freq.to(positions.device, torch.float32)
    pair = torch.arange(inv_freq.shape[0], device=positions.device)
    axis = torch.zeros_like(pair)
    for dim in (1, 2):
        axis = torch.where((pair % 3 == dim) & (pair < 3 * section[dim]), dim, axis)
    angles = freqs.gather(0, axis.expand(1, freqs.shape[1], -1))[0]  # [T, R/2]
    return angles.cos() * attention_factor, angles.sin() * attention_factor
