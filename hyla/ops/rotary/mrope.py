"""Multimodal RoPE (Qwen2-VL; interleaved as transformers `Qwen3_5TextRotaryEmbedding`): three
positions (t, h, w) per token, equal for text; image placeholders take their merged grid
coordinates plus the image's start, later text continues from start + max(gh, gw). Pair j uses
axis h when j % 3 == 1 and j < 3 * section[1], w when j % 3 == 2 and j < 3 * section[2], else t."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def mrope_positions(
    token_types: Sequence[int], grids: Sequence[tuple[int, int, int]], merge: int
) -> tuple[torch.Tensor, int]:
    """(positions [3, L], delta = max position + 1 - L for later tokens) of a prompt whose
    tokens are text (0) or image placeholders (1), `grids` the images' (t, h, w) in order."""
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
    """positions [3, T] -> (cos, sin), each [T, R/2] fp32 as `rope_cos_sin`."""
    freqs = positions[..., None].float() * inv_freq.to(positions.device, torch.float32)
    pair = torch.arange(inv_freq.shape[0], device=positions.device)
    axis = torch.zeros_like(pair)
    for dim in (1, 2):
        axis = torch.where((pair % 3 == dim) & (pair < 3 * section[dim]), dim, axis)
    angles = freqs.gather(0, axis.expand(1, freqs.shape[1], -1))[0]
    return angles.cos() * attention_factor, angles.sin() * attention_factor
