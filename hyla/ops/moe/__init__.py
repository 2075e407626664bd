"""Mixture-of-experts routing and expert computation. See `reference.py` for the definitions.

`moe_experts` is the grouped form of `cpu.py` (tokens sorted by expert once) for CPU tensors and
the sync-free form of `kernels.py` for CUDA tensors; both are tested against the per-expert
reference. `route_sigmoid` / `route_softmax` are the reference's for CPU tensors and one Triton
kernel each (`route_kernels.py`, imported on first use) for CUDA tensors; the interpreter tests
patch `use_triton` here to send CPU tensors there too.
"""

import torch

from hyla.ops.gpu import use_triton
from hyla.ops.moe import cpu, kernels, reference
from hyla.ops.moe.reference import group_limited_mask, stable_topk


def route_sigmoid(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    norm_topk_prob: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.route_sigmoid` (see there for shapes): one Triton kernel for CUDA tensors."""
    args = (top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor)
    if use_triton(router_logits):
        from hyla.ops.moe import route_kernels

        if route_kernels.supports(router_logits, top_k):
            return route_kernels.route_sigmoid(router_logits, correction_bias, *args)
    return reference.route_sigmoid(router_logits, correction_bias, *args)


def route_softmax(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.route_softmax` (see there for shapes): one Triton kernel for CUDA tensors."""
    if use_triton(router_logits):
        from hyla.ops.moe import route_kernels

        if route_kernels.supports(router_logits, top_k):
            return route_kernels.route_softmax(router_logits, top_k, norm_topk_prob)
    return reference.route_softmax(router_logits, top_k, norm_topk_prob)


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
