"""Vision-encoder ops of the GLM / Qwen-VL family (transformers' `Glm5NextVisionModel`):
2-D axial rotary positions of the patches and bidirectional attention within each image.

Patches come in spatial-merge-block order: for a grid of h x w patches and merge size m, the
m x m patches that merge into one LLM token are consecutive:

    grid 4 x 4, m = 2:   (0,0) (0,1) (1,0) (1,1) | (0,2) (0,3) (1,2) (1,3) | (2,0) ...
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def patch_positions(grid_thw: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """(h, w) grid coordinates of every patch in merge-block order, frames repeated:
    [sum t*h*w, 2] int64."""
    out = []
    for t, h, w in grid_thw:
        hh, ww = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        block = (h // merge, merge, w // merge, merge)
        pos = torch.stack([x.reshape(block).transpose(1, 2).flatten() for x in (hh, ww)], -1)
        out.append(pos.repeat(t, 1))
    return torch.cat(out)


def axial_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, head_dim] float32 of the axial rope: frequencies over head_dim / 2 channels
    shared by the h and w coordinates, laid out [h | w | h | w] for rotate-half."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
    freqs = positions.float()[..., None] * inv_freq  # [N, 2, head_dim / 4]
    angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, Dh] rotated in float32 (cos, sin [N, Dh]), returned in x's dtype."""
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int], scale: float
) -> torch.Tensor:
    """Bidirectional attention within each segment [cu[i], cu[i + 1]) (one image frame):
    q, k, v [N, H, Dh] -> [N, H, Dh]; softmax in float32."""
    out = torch.empty_like(q)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [H, n, Dh]
        weights = F.softmax((qs @ ks.transpose(1, 2)) * scale, dim=-1, dtype=torch.float32)
        out[start:end] = (weights.to(q.dtype) @ vs).transpose(0, 1)
    return out
