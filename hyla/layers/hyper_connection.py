"""Hyper-connection weights of one block (GLM-5.3-Flash's `attn_hc` / `ffn_hc`; checkpoints
name them `hc_attn_fn`, `hc_attn_base`, ...); the math is `hyla.ops.hyper_connection`."""

from __future__ import annotations

import torch
from torch import nn

from hyla.config import ModelConfig
from hyla.layers.norm import RMSNorm
from hyla.ops.hyper_connection import (
    hc_collapse,
    hc_expand,
    hc_head_weights,
    hc_pre_norm,
    hc_weights,
)


class HyperConnection(nn.Module):
    """Collapses N streams into a block's input and spreads its output back (`hc_mult` = N)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        n, d = config.hc_mult, config.hidden_size
        self.fn = nn.Parameter(torch.empty((2 + n) * n, n * d))
        self.base = nn.Parameter(torch.zeros((2 + n) * n, dtype=torch.float32))
        self.scale = nn.Parameter(torch.ones(3, dtype=torch.float32))
        self.hc_eps, self.iters = config.hc_eps, config.hc_sinkhorn_iters
        self.norm_eps = config.rms_norm_eps

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [T, N, D] -> (block input [T, D], post [T, N], comb [T, N, N])."""
        pre, post, comb = hc_weights(
            streams, self.fn, self.base, self.scale, self.hc_eps, self.iters, self.norm_eps
        )
        return hc_collapse(streams, pre), post, comb

    def pre_norm(
        self, streams: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`forward` with the block's input norm applied."""
        return hc_pre_norm(
            streams, self.fn, self.base, self.scale, self.hc_eps, self.iters, self.norm_eps,
            norm.weight, norm.eps, norm.offset,
        )  # fmt: skip

    @staticmethod
    def expand(
        block_out: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
    ) -> torch.Tensor:
        return hc_expand(block_out, streams, post, comb)


class HyperHead(nn.Module):
    """DeepSeek-V4's final collapse of the N streams by learned weights."""

    keep_fp32 = ("hc_fn", "hc_base", "hc_scale")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        n, d = config.hc_mult, config.hidden_size
        self.hc_fn = nn.Parameter(torch.empty(n, n * d, dtype=torch.float32))
        self.hc_base = nn.Parameter(torch.zeros(n, dtype=torch.float32))
        self.hc_scale = nn.Parameter(torch.ones(1, dtype=torch.float32))
        self.hc_eps, self.norm_eps = config.hc_eps, config.rms_norm_eps

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        pre = hc_head_weights(streams, self.hc_fn, self.hc_base, self.hc_scale, self.hc_eps,
                              self.norm_eps)  # fmt: skip
        return hc_collapse(streams, pre)
