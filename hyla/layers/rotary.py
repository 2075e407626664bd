"""Rotary embedding module over `hyla.ops.rotary`."""

from __future__ import annotations

import torch
from torch import nn

from hyla.config import RopeConfig
from hyla.ops.rotary import apply_rope, rope_cos_sin, rope_inv_freq
from hyla.ops.rotary.mrope import mrope_cos_sin


class RotaryEmbedding(nn.Module):
    """cos/sin of a RopeConfig. `inv_freq` is a plain fp32 attribute, not a buffer: no
    checkpoint tensor, and `model.to(bfloat16)` cannot round it."""

    def __init__(self, rope: RopeConfig) -> None:
        super().__init__()
        self.rope = rope
        self.inv_freq, self.attention_factor = rope_inv_freq(rope)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] (or [3, T]: M-RoPE) -> (cos, sin), each [T, rotary_dim / 2] fp32."""
        if self.inv_freq.device != positions.device:  # once: a per-call copy breaks CUDA graphs
            self.inv_freq = self.inv_freq.to(positions.device)
        if positions.dim() == 2:
            section = self.rope.scaling_dict().get("mrope_section")
            if section is None:
                raise ValueError("rotary: [3, T] positions need rope.scaling.mrope_section")
            return mrope_cos_sin(positions, self.inv_freq, section, self.attention_factor)
        return rope_cos_sin(positions, self.inv_freq, self.attention_factor)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, cos, sin, self.rope.style)
