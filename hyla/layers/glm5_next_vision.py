"""GLM-5.3-Flash's vision tower (transformers `Glm5NextVisionModel`, same parameter names):
patches -> one LLM-sized embedding per merged m x m block of patches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hyla.config import ConfigError
from hyla.hf_fields import HFFields
from hyla.ops.activation import silu_and_mul_clamped
from hyla.ops.norm import rms_norm
from hyla.ops.vision import apply_rotate_half, axial_cos_sin, patch_positions, segment_attention


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's dimensions (transformers' `Glm5NextVisionConfig` names)."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    projection_intermediate_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int = 3
    rms_norm_eps: float = 1e-5
    swiglu_limit: float = 10.0
    attention_bias: bool = True
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("depth", "hidden_size", "num_heads", "intermediate_size", "out_hidden_size",
                     "projection_intermediate_size", "patch_size", "temporal_patch_size",
                     "spatial_merge_size", "in_channels"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(
                    f"vision_config.{name}: must be a positive integer, got {value!r}"
                )
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ConfigError(
                f"vision_config.num_heads: head dim {self.hidden_size}/{self.num_heads} must be "
                "an integer multiple of 4 (axial rope over h and w)"
            )

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> VisionConfig:
        """From a `vision_config` dict. Raises ConfigError naming the field."""
        f = HFFields(d)
        rope = HFFields(f.raw("rope_parameters", None) or {})
        act = f.string("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"vision_config.hidden_act: only 'silu' is supported, got {act!r}")
        return cls(
            depth=f.integer("depth", 24),
            hidden_size=f.integer("hidden_size", 1024),
            num_heads=f.integer("num_heads", 16),
            intermediate_size=f.integer("intermediate_size", 4096),
            out_hidden_size=f.integer("out_hidden_size", 1536),
            projection_intermediate_size=f.integer("projection_intermediate_size", 10240),
            patch_size=f.integer("patch_size", 14),
            temporal_patch_size=f.integer("temporal_patch_size", 2),
            spatial_merge_size=f.integer("spatial_merge_size", 2),
            in_channels=f.integer("in_channels", 3),
            rms_norm_eps=f.number("rms_norm_eps", 1e-5),
            swiglu_limit=f.number("swiglu_limit", 10.0),
            attention_bias=f.flag("attention_bias", True),
            rope_theta=rope.number("rope_theta", 10000.0),
        )


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class _ClampedSwiGLU(nn.Module):
    def __init__(self, dim: int, inner: int, bias: bool, limit: float) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, inner, bias=bias)
        self.up_proj = nn.Linear(dim, inner, bias=bias)
        self.down_proj = nn.Linear(inner, dim, bias=bias)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        return self.down_proj(silu_and_mul_clamped(gate_up, self.limit))


class _Attention(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.attention_bias)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = _RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = _RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos_sin: tuple, cu_seqlens: list[int]) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.num_heads, self.head_dim).unbind(1)
        q = apply_rotate_half(self.q_norm(q), *cos_sin)
        k = apply_rotate_half(self.k_norm(k), *cos_sin)
        out = segment_attention(q, k, v, cu_seqlens, self.head_dim**-0.5)
        return self.proj(out.flatten(1))


class _Block(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1 = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm2 = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = _Attention(cfg)
        self.mlp = _ClampedSwiGLU(
            cfg.hidden_size, cfg.intermediate_size, cfg.attention_bias, cfg.swiglu_limit
        )

    def forward(self, x: torch.Tensor, cos_sin: tuple, cu_seqlens: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos_sin, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class _Merger(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        dim = cfg.out_hidden_size
        self.proj = nn.Linear(dim, dim, bias=False)
        self.post_projection_norm = nn.LayerNorm(dim)
        self.gate_proj = nn.Linear(dim, cfg.projection_intermediate_size, bias=False)
        self.up_proj = nn.Linear(dim, cfg.projection_intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.projection_intermediate_size, dim, bias=False)
        self.limit = cfg.swiglu_limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.post_projection_norm(self.proj(x)))
        gate_up = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        return self.down_proj(silu_and_mul_clamped(gate_up, self.limit))


class Glm5NextVisionTower(nn.Module):
    """pixel_values [N, C*t*p*p], grid_thw [(t, h, w), ...] -> placeholder rows [N / m^2, D]."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.config = cfg
        t, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.spatial_merge_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, (t, p, p), (t, p, p))
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.post_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.downsample = nn.Conv2d(cfg.hidden_size, cfg.out_hidden_size, m, m)
        self.merger = _Merger(cfg)

    def forward(
        self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        cfg = self.config
        m = cfg.spatial_merge_size
        proj = self.patch_embed.proj  # a conv with stride = kernel: one matmul per patch
        x = F.linear(pixel_values.to(proj.weight.dtype), proj.weight.flatten(1), proj.bias)
        cos_sin = axial_cos_sin(
            patch_positions(grid_thw, m).to(x.device), cfg.hidden_size // cfg.num_heads,
            cfg.rope_theta,
        )  # fmt: skip
        cu = [0]
        for t, h, w in grid_thw:
            cu += [cu[-1] + h * w * (i + 1) for i in range(t)]
        for block in self.blocks:
            x = block(x, cos_sin, cu)
        x = self.post_layernorm(x)
        x = x.view(-1, m, m, x.shape[-1]).permute(0, 3, 1, 2).flatten(1)
        x = F.linear(x, self.downsample.weight.flatten(1), self.downsample.bias)
        return self.merger(x)
