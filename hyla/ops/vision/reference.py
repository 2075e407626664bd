"""Vision-encoder ops of the GLM / Qwen-VL family (transformers `Glm5NextVisionModel`): axial
rope and per-image attention. Patches come in merge-block order (each m x m block consecutive)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def patch_positions(grid_thw: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """(h, w) of every patch in merge-block order, frames repeated: [sum t*h*w, 2]."""
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
    """cos, sin [N, head_dim] fp32 of the axial rope, laid out [h | w | h | w] (rotate-half)."""
    spatial = head_dim // 2
    steps = torch.arange(0, spatial, 2, dtype=torch.float, device=positions.device)
    inv_freq = 1.0 / (theta ** (steps / spatial))
    freqs = positions.float()[..., None] * inv_freq
    angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int], scale: float
) -> torch.Tensor:
    """Bidirectional attention within each segment (frame); q, k, v [N, H, Dh]."""
    out = torch.empty_like(q)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        weights = F.softmax((qs @ ks.transpose(1, 2)) * scale, dim=-1, dtype=torch.float32)
        out[start:end] = (weights.to(q.dtype) @ vs).transpose(0, 1)
    return out
