"""Clamped-SwiGLU routed experts (GLM-5.3-Flash). See `reference.py`; PyTorch on every device
(the GEMVs of `hyla.ops.moe` compute an unclamped SwiGLU). On CUDA, small batches (T E <=
DENSE_MAX, every decode step of a model with a few hundred experts and <= 32 sequences) take
the sync-free dense form, which CUDA graphs can capture; the grouped form reads the routing
on the host."""

from __future__ import annotations

import torch

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
    """hidden_states [T, D], gate_up_proj [E, 2I, D], down_proj [E, D, I], topk_weights
    [T, k], topk_ids [T, k] int64 -> [T, D] (`reference.moe_experts_clamped`)."""
    args = (hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, limit)
    if hidden_states.is_cuda and hidden_states.shape[0] * gate_up_proj.shape[0] <= DENSE_MAX:
        return moe_experts_clamped_dense(*args)
    return grouped(*args)
