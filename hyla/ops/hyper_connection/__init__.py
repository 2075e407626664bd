"""Hyper-connection mixing (mHC, `reference.py`); `hc_pre_norm` and `hc_expand` use the Triton
kernels on CUDA tensors outside autograd."""

from __future__ import annotations

import torch

from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.hyper_connection import reference
from hyla.ops.hyper_connection.reference import (
    hc_collapse,
    hc_head_weights,
    hc_weights,
    sinkhorn,
)

__all__ = ["hc_collapse", "hc_expand", "hc_head_weights", "hc_pre_norm", "hc_weights", "sinkhorn"]


def hc_pre_norm(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    hc_eps: float,
    sinkhorn_iters: int,
    norm_eps: float,
    norm_weight: torch.Tensor,
    rms_eps: float,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`reference.hc_pre_norm`: streams [T, N, D] -> (x [T, D], post [T, N], comb [T, N, N])."""
    args = (streams, fn, base, scale, hc_eps, sinkhorn_iters, norm_eps, norm_weight, rms_eps,
            offset)  # fmt: skip
    if use_triton(streams) and not needs_grad(streams, fn, base, scale, norm_weight):
        from hyla.ops.hyper_connection import kernels

        return kernels.hc_pre_norm(*args)
    return reference.hc_pre_norm(*args)


def hc_expand(
    block_out: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    if use_triton(streams) and not needs_grad(block_out, streams, post, comb):
        from hyla.ops.hyper_connection import kernels

        return kernels.hc_expand(block_out, streams, post, comb)
    return reference.hc_expand(block_out, streams, post, comb)
