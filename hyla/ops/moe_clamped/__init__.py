"""Clamped-SwiGLU routed experts (GLM-5.3-Flash): `hyla.ops.moe`'s kernels; without triton, the
sync-free dense form for small CUDA batches, else the grouped reference."""

from __future__ import annotations

import torch

from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.moe_clamped.reference import moe_experts_clamped as grouped
from hyla.ops.moe_clamped.reference import moe_experts_clamped_dense

__all__ = ["moe_experts_clamped", "moe_experts_clamped_dense"]

DENSE_MAX = 8192


def moe_experts_clamped(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """`reference.moe_experts_clamped`: hidden_states [T, D] -> [T, D]."""
    args = (hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, limit)
    if use_triton(hidden_states) and not needs_grad(hidden_states, gate_up_proj, down_proj):
        from hyla.ops.moe import kernels

        return kernels.moe_experts(*args[:5], limit=limit)
    if hidden_states.is_cuda and hidden_states.shape[0] * gate_up_proj.shape[0] <= DENSE_MAX:
        return moe_experts_clamped_dense(*args)
    return grouped(*args)
