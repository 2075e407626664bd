"""Routed experts with block-scaled float8_e4m3fn weights."""

from __future__ import annotations

import torch
from torch import nn

from hyla.ops.fp8 import FP8, fp8_moe_experts


class Fp8Experts(nn.Module):
    """E SwiGLU experts in fp8, one scale per (bn, bk) block; `gate_up_proj` [E, 2I, D] is two
    matrices (gate, up), each with its own block grid."""

    keep_fp32 = ("gate_up_proj_scale_inv", "down_proj_scale_inv")
    num_parts = {"gate_up_proj": 2, "down_proj": 1}

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        block_size: tuple[int, int],
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        E, I, D = num_experts, intermediate_size, hidden_size
        self.block_size = tuple(block_size)
        bn, bk = self.block_size
        cdiv = lambda a, b: -(-a // b)  # noqa: E731

        def param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
            data = torch.empty(*shape, dtype=dtype, device=device)
            return nn.Parameter(data, requires_grad=False)

        self.gate_up_proj = param(E, 2 * I, D, dtype=FP8)
        self.gate_up_proj_scale_inv = param(E, 2 * cdiv(I, bn), cdiv(D, bk), dtype=torch.float32)
        self.down_proj = param(E, D, I, dtype=FP8)
        self.down_proj_scale_inv = param(E, cdiv(D, bn), cdiv(I, bk), dtype=torch.float32)

    def forward(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return fp8_moe_experts(
            hidden_states, self.gate_up_proj, self.gate_up_proj_scale_inv, self.down_proj,
            self.down_proj_scale_inv, topk_weights, topk_ids, self.block_size,
        )  # fmt: skip
