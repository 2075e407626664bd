"""Routed experts on a GPU, no host sync. By P = T k: P <= E Triton GEMVs; 3P <= E gathered; T E
<= 8192 dense; else the Triton grouped GEMM or `cpu.moe_experts` (one sync). The limits are
guesses from byte and FLOP counts, not measured."""

from __future__ import annotations

import torch

from hyla.ops.activation import silu_and_mul, silu_and_mul_clamped
from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.moe.cpu import moe_experts as grouped_moe_experts

DENSE_MAX_ROWS = 8192


def sync_free(num_tokens: int, topk: int, num_experts: int) -> bool:
    """Whether `moe_experts` takes the GEMV / gathered / dense forms, not the grouped GEMM."""
    return num_tokens * topk <= num_experts or num_tokens * num_experts <= DENSE_MAX_ROWS


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
    """`reference.moe_experts` (ids distinct per row); `packed`: for `cpu.moe_experts`."""
    num_pairs, num_experts = topk_ids.numel(), gate_up_proj.shape[0]
    if num_pairs == 0:
        return torch.zeros_like(hidden_states)
    num_tokens, topk = topk_ids.shape
    if num_pairs <= num_experts and use_triton(hidden_states):
        from hyla.ops.moe.gemv import moe_gemv

        return moe_gemv(hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, limit=limit)
    if 3 * num_pairs <= num_experts:
        y = _gathered(hidden_states, gate_up_proj, down_proj, topk_ids, limit)
    elif sync_free(num_tokens, topk, num_experts):
        y = _dense(hidden_states, gate_up_proj, down_proj, limit)
        if use_triton(hidden_states):
            from hyla.ops.moe.gemv import combine

            return combine(y, topk_weights, topk_ids, hidden_states.dtype)
        y = _select(y, topk_ids)
    elif use_triton(hidden_states) and not needs_grad(hidden_states, gate_up_proj, down_proj):
        from hyla.ops.moe import grouped

        return grouped.moe_experts(
            hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, limit=limit
        )
    elif limit is not None:
        from hyla.ops.moe_clamped.reference import moe_experts_clamped

        return moe_experts_clamped(
            hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, limit
        )
    else:
        return grouped_moe_experts(
            hidden_states, gate_up_proj, down_proj, topk_weights, topk_ids, packed=packed
        )
    return _weighted_sum(y, topk_weights, topk_ids, hidden_states.dtype)


def _activation(gate_up: torch.Tensor, limit: float | None) -> torch.Tensor:
    return silu_and_mul(gate_up) if limit is None else silu_and_mul_clamped(gate_up, limit)


def _gathered(
    x: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_ids: torch.Tensor,
    limit: float | None = None,
) -> torch.Tensor:
    T, k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    rows = x.repeat_interleave(k, dim=0).unsqueeze(1)
    w1 = gate_up_proj.index_select(0, flat)
    gate_up = torch.bmm(rows, w1.transpose(1, 2))
    w2 = down_proj.index_select(0, flat)
    return torch.bmm(_activation(gate_up, limit), w2.transpose(1, 2)).view(T, k, -1)


def _dense(
    x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, limit: float | None
) -> torch.Tensor:
    num_experts = gate_up_proj.shape[0]
    rows = x.unsqueeze(0).expand(num_experts, -1, -1)
    gate_up = torch.bmm(rows, gate_up_proj.transpose(1, 2))
    return torch.bmm(_activation(gate_up, limit), down_proj.transpose(1, 2))


def _select(y: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    tokens = torch.arange(y.shape[1], device=y.device).unsqueeze(1)
    return y[topk_ids, tokens]


def _weighted_sum(
    y: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    # Terms rounded to `dtype` and summed in ascending expert order, as the reference's index_add_.
    terms = (y * topk_weights.unsqueeze(-1)).to(dtype)
    order = topk_ids.argsort(dim=1)
    terms = terms.gather(1, order.unsqueeze(-1).expand_as(terms))
    out = terms[:, 0].clone()
    for r in range(1, terms.shape[1]):
        out += terms[:, r]
    return out
