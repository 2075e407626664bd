"""Clamped-SwiGLU routed experts (GLM-5.3-Flash). See `reference.py`. CUDA tensors with triton
take `hyla.ops.moe`'s kernels with the clamp (`limit`: GEMVs for decode, the dense or grouped
forms for larger steps, all sync-free); without triton, small CUDA batches (T E <= DENSE_MAX)
take the sync-free dense form here and the rest the grouped reference, which reads the routing
on the host."""

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
    """hidden_states [T, D], gate_up_proj [E, 2I, D], down_proj [E, D, I], topk_weights
    [T, k], topk_ids [T, k] int64 -> [T, D] (`reference.moe_experts_clamped`)."""
    args = (hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, limit)
    if use_triton(hidden_states) and not needs_grad(hidden_states, gate_up_proj, down_proj):
        from hyla.ops.moe import kernels

        return kernels.moe_experts(*args[:5], limit=limit)
    if hidden_states.is_cuda and hidden_states.shape[0] * gate_up_proj.shape[0] <= DENSE_MAX:
        return moe_experts_clamped_dense(*args)
    return grouped(*args)
