"""Mixture-of-experts routing and experts: `cpu.py` (grouped) on the CPU, the sync-free Triton
kernels on CUDA; the interpreter tests patch `use_triton` here to send CPU tensors there too."""

import torch

from hyla.ops.activation import silu_and_mul, silu_and_mul_clamped
from hyla.ops.gpu import use_triton
from hyla.ops.linear.dispatch import linear
from hyla.ops.moe import cpu, kernels, reference
from hyla.ops.moe.reference import (
    group_limited_mask,
    route_hash,
    route_sqrt_softplus,
    stable_topk,
)


def route_sigmoid(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    norm_topk_prob: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.route_sigmoid` (shapes there)."""
    args = (top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor)
    if use_triton(router_logits):
        from hyla.ops.moe import route_kernels

        if route_kernels.supports(router_logits, top_k):
            return route_kernels.route_sigmoid(router_logits, correction_bias, *args)
    return reference.route_sigmoid(router_logits, correction_bias, *args)


def route_softmax(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.route_softmax` (shapes there)."""
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
    limit: float | None = None,
) -> torch.Tensor:
    """`reference.moe_experts` (shapes there); `limit`: the clamped SwiGLU (GLM-5.3-Flash)."""
    args = (hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids)
    if hidden_states.is_cuda:
        return kernels.moe_experts(*args, packed=packed, limit=limit)
    if limit is not None:
        from hyla.ops.moe_clamped.reference import moe_experts_clamped

        return moe_experts_clamped(*args, limit)
    return cpu.moe_experts(*args, packed=packed)


def fuses_shared(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_ids: torch.Tensor,
    shared_gate_up: torch.Tensor,
    shared_down: torch.Tensor,
) -> bool:
    """Whether the shared expert runs inside the routed experts' GEMV kernels."""
    if not (use_triton(hidden_states) and 0 < topk_ids.numel() <= gate_up_proj.shape[0]):
        return False
    from hyla.ops.moe import gemv

    return gemv.shared_fits(gate_up_proj, down_proj, shared_gate_up, shared_down)


def moe_experts_and_shared(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    shared_gate_up: torch.Tensor,
    shared_down: torch.Tensor,
    limit: float | None = None,
) -> torch.Tensor:
    """`moe_experts` plus an ungated shared expert (shared_gate_up [2I', D], shared_down [D, I']),
    each rounded to the hidden dtype as it would be alone."""
    if fuses_shared(hidden_states, gate_up_proj, down_proj, topk_ids, shared_gate_up, shared_down):
        from hyla.ops.moe import gemv

        shared = (shared_gate_up, shared_down)
        return gemv.moe_gemv(
            hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, shared=shared,
            limit=limit,
        )  # fmt: skip
    routed = moe_experts(
        hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, limit=limit
    )
    gate_up = linear(hidden_states, shared_gate_up)
    act = silu_and_mul(gate_up) if limit is None else silu_and_mul_clamped(gate_up, limit)
    return routed + linear(act, shared_down)


__all__ = [
    "fuses_shared",
    "group_limited_mask",
    "moe_experts",
    "moe_experts_and_shared",
    "route_hash",
    "route_sigmoid",
    "route_softmax",
    "route_sqrt_softplus",
    "stable_topk",
]
