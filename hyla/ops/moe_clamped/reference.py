"""Routed SwiGLU experts with GLM-5.3-Flash's `swiglu_limit` clamp (`Glm5NextTextExperts`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyla.ops.activation.reference import silu_and_mul_clamped


def moe_experts_clamped(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """hidden_states [T, D], gate_up_proj [E, 2I, D], down_proj [E, D, I], topk_weights [T, k],
    topk_ids [T, k] int64 -> [T, D]; grouped by expert, any device."""
    out = torch.zeros_like(hidden_states)
    flat_ids = topk_ids.flatten()
    for expert in torch.unique(flat_ids).tolist():
        token, slot = torch.nonzero(topk_ids == expert, as_tuple=True)
        act = silu_and_mul_clamped(F.linear(hidden_states[token], gate_up_proj[expert]), limit)
        y = F.linear(act, down_proj[expert]) * topk_weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def moe_experts_clamped_dense(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """Every expert over every token: no host sync, but E times the work (small T only)."""
    num_experts = gate_up_proj.shape[0]
    gate_up = torch.einsum("td,efd->etf", hidden_states, gate_up_proj)
    y = torch.einsum("eti,edi->etd", silu_and_mul_clamped(gate_up, limit), down_proj)
    dense_w = hidden_states.new_zeros(hidden_states.shape[0], num_experts, dtype=y.dtype)
    dense_w.scatter_add_(1, topk_ids, topk_weights.to(y.dtype))
    return torch.einsum("te,etd->td", dense_w, y).to(hidden_states.dtype)
