"""Qwen3.5's vision tower (transformers `Qwen3_5VisionModel`, same parameter names): patches ->
one LLM-sized embedding per merged m x m block of patches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hyla.config import ConfigError
from hyla.hf_fields import HFFields
from hyla.ops.vision import apply_rotate_half, axial_cos_sin, patch_positions, segment_attention

_ACTS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}


@dataclass(frozen=True)
class Qwen35VisionConfig:
    """The vision tower's dimensions (transformers' `Qwen3_5VisionConfig` names)."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    num_position_embeddings: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.hidden_act not in _ACTS:
            raise ConfigError(f"vision_config.hidden_act: {self.hidden_act!r} not in {list(_ACTS)}")
        side = int(self.num_position_embeddings**0.5)
        if side * side != self.num_position_embeddings:
            raise ConfigError("vision_config.num_position_embeddings: must be a square number")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ConfigError("vision_config.num_heads: head dim must be a multiple of 4")

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> Qwen35VisionConfig:
        """From a `vision_config` dict. Raises ConfigError naming the field."""
        f = HFFields(d)
        rope = HFFields(f.raw("rope_parameters", None) or {})
        return cls(
            depth=f.integer("depth", 27),
            hidden_size=f.integer("hidden_size", 1152),
            num_heads=f.integer("num_heads", 16),
            intermediate_size=f.integer("intermediate_size", 4304),
            out_hidden_size=f.integer("out_hidden_size", 3584),
            num_position_embeddings=f.integer("num_position_embeddings", 2304),
            patch_size=f.integer("patch_size", 16),
            temporal_patch_size=f.integer("temporal_patch_size", 2),
            spatial_merge_size=f.integer("spatial_merge_size", 2),
            in_channels=f.integer("in_channels", 3),
            hidden_act=f.string("hidden_act", "gelu_pytorch_tanh"),
            rope_theta=rope.number("rope_theta", 10000.0),
        )


class _Attention(nn.Module):
    def __init__(self, cfg: Qwen35VisionConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos_sin: tuple, cu_seqlens: list[int]) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.num_heads, self.head_dim).unbind(1)
        q, k = apply_rotate_half(q, *cos_sin), apply_rotate_half(k, *cos_sin)
        out = segment_attention(q, k, v, cu_seqlens, self.head_dim**-0.5)
        return self.proj(out.flatten(1))


class _MLP(nn.Module):
    def __init__(self, dim: int, inner: int, out: int, approximate: str) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, inner)
        self.linear_fc2 = nn.Linear(inner, out)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class _Block(nn.Module):
    def __init__(self, cfg: Qwen35VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = _Attention(cfg)
        self.mlp = _MLP(
            cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size, _ACTS[cfg.hidden_act]
        )

    def forward(self, x: torch.Tensor, cos_sin: tuple, cu_seqlens: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos_sin, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class _Merger(nn.Module):
    def __init__(self, cfg: Qwen35VisionConfig) -> None:
        super().__init__()
        wide = cfg.hidden_size * cfg.spatial_merge_size**2
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(wide, wide)
        self.linear_fc2 = nn.Linear(wide, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).view(-1, self.linear_fc1.in_features)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class Qwen35VisionTower(nn.Module):
    """pixel_values [N, C*t*p*p], grid_thw [(t, h, w), ...] -> placeholder rows [N / m^2, D]."""

    def __init__(self, cfg: Qwen35VisionConfig) -> None:
        super().__init__()
        self.config = cfg
        t, p = cfg.temporal_patch_size, cfg.patch_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, (t, p, p), (t, p, p))
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.merger = _Merger(cfg)

    def positions(self, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """Learned position embeddings [N, Dv], the square table resampled to each grid."""
        m = self.config.spatial_merge_size
        side = int(self.config.num_position_embeddings**0.5)
        table = self.pos_embed.weight.view(side, side, -1).permute(2, 0, 1)[None]
        out = []
        for t, h, w in grid_thw:
            grid = F.interpolate(table.float(), size=(h, w), mode="bilinear", align_corners=True)
            grid = grid[0].permute(1, 2, 0)
            blocks = grid.view(h // m, m, w // m, m, -1).transpose(1, 2).reshape(h * w, -1)
            out.append(blocks.repeat(t, 1))
        return torch.cat(out)

    def forward(
        self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        cfg = self.config
        proj = self.patch_embed.proj  # a conv with stride = kernel: one matmul per patch
        x = F.linear(pixel_values.to(proj.weight.dtype), proj.weight.flatten(1), proj.bias)
        x = x + self.positions(grid_thw).to(x.dtype)
        cos_sin = axial_cos_sin(
            patch_positions(grid_thw, cfg.spatial_merge_size).to(x.device),
            cfg.hidden_size // cfg.num_heads, cfg.rope_theta,
        )  # fmt: skip
        cu = [0]
        for t, h, w in grid_thw:
            cu += [cu[-1] + h * w * (i + 1) for i in range(t)]
        for block in self.blocks:
            x = block(x, cos_sin, cu)
        return self.merger(x)
