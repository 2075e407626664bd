"""SwiGLU feed-forward layer (Shazeer 2020, "GLU Variants Improve Transformer")."""

from __future__ import annotations

import torch
from torch import nn

from hyla.config import ModelConfig
from hyla.layers.linear import Linear, stacked_linear
from hyla.ops.activation import silu_and_mul, silu_and_mul_clamped
from hyla.ops.linear import Prepacked


class GatedMLP(nn.Module):
    """`down_proj(silu(gate_proj(x)) * up_proj(x))`, no biases; `layer_idx` is unused (the FFN
    registry's signature), `intermediate_size` defaults to the config's (shared experts)."""

    def __init__(
        self, config: ModelConfig, layer_idx: int = 0, intermediate_size: int | None = None
    ) -> None:
        super().__init__()
        width = config.intermediate_size if intermediate_size is None else intermediate_size
        self.layer_idx = layer_idx
        self.gate_proj = Linear(config.hidden_size, width, bias=False)
        self.up_proj = Linear(config.hidden_size, width, bias=False)
        self.down_proj = Linear(width, config.hidden_size, bias=False)
        self.gate_up_packed = Prepacked()
        self.swiglu_limit = config.swiglu_limit  # GLM-5.3-Flash: clamp gate and up first

    def stacked_projections(self) -> tuple[nn.Linear, ...]:
        return (self.gate_proj, self.up_proj)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gate_up = stacked_linear(hidden_states, self.stacked_projections(), self.gate_up_packed)
        if self.swiglu_limit is not None:
            return self.down_proj(silu_and_mul_clamped(gate_up, self.swiglu_limit))
        return self.down_proj(silu_and_mul(gate_up))
