"""Rotary embedding module: holds the inverse frequencies of a RopeConfig, computes cos/sin."""

from __future__ import annotations

import torch
from torch import nn

from hyla.config import RopeConfig
from hyla.ops.rotary import apply_rope, rope_cos_sin, rope_inv_freq
from hyla.ops.rotary.mrope import mrope_cos_sin


class RotaryEmbedding(nn.Module):
    """`forward(positions [T] int64) -> (cos, sin)`, each `[T, rotary_dim / 2]` float32.

    The frequencies are a plain float32 attribute (not a buffer): the module adds no checkpoint
    tensor and `model.to(bfloat16)` cannot round them; they follow `positions`' device.
    `rotate(x [T, H, D], cos, sin)` rotates the first `rotary_dim` channels in `rope.style`.
    """

    def __init__(self, rope: RopeConfig) -> None:
        super().__init__()
        self.rope = rope
        self.inv_freq, self.attention_factor = rope_inv_freq(rope)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> (cos, sin), each [T, rotary_dim / 2] float32; positions
        [3, T] (t, h, w) take multimodal RoPE by the config's `mrope_section` (Qwen3.5)."""
        if self.inv_freq.device != positions.device:  # moved once (a copy per call would be a
            self.inv_freq = self.inv_freq.to(positions.device)  # host copy in a CUDA graph)
        if positions.dim() == 2:
            section = self.rope.scaling_dict().get("mrope_section")
            if section is None:
                raise ValueError("rotary: [3, T] positions need rope.scaling.mrope_section")
            return mrope_cos_sin(positions, self.inv_freq, section, self.attention_factor)
        return rope_cos_sin(positions, self.inv_freq, self.attention_factor)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, H, D] -> [T, H, D] in x's dtype, first `rotary_dim` channels rotated."""
        return apply_rope(x, cos, sin, self.rope.style)
