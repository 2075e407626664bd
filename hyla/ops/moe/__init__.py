"""Mixture-of-experts routing and expert computation. See `reference.py` for the definitions.

`moe_experts` is the grouped form of `cpu.py` (tokens sorted by expert once) for CPU tensors and
the sync-free form of `kernels.py` for CUDA tensors; both are tested against the per-expert
reference.
"""

import torch

from hyla.ops.moe import cpu, kernels
from hyla.ops.moe.reference import (
    group_limited_mask,
    route_sigmoid,
    route_softmax,
    stable_topk,
)


def moe_experts(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    packed: tuple | None = None,
) -> torch.Tensor:
    """`reference.moe_experts` (see there for shapes): `kernels.moe_experts` for CUDA tensors
    (no host sync for decode-sized batches), `cpu.moe_experts` otherwise."""
    impl = kernels.moe_experts if hidden_states.is_cuda else cpu.moe_experts
    return impl(hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, packed=packed)


__all__ = ["group_limited_mask", "moe_experts", "route_sigmoid", "route_softmax", "stable_topk"]
