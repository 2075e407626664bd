"""`reference.moe_experts` with the (token, slot) pairs sorted by expert once; sums in ascending
expert order as the reference. Bit for bit the reference's, except on oneDNN `packed` copies or
the padded batched form (multi-threaded decode), which agree to fp32 rounding."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from hyla.ops.linear import Prepacked, packed_matmul, usable

_BATCHED_MAX_ROWS = 32


def moe_experts(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    packed: tuple[Prepacked, Prepacked] | None = None,
) -> torch.Tensor:
    """`reference.moe_experts`; `packed`: the `Prepacked` caches of gate_up_proj and down_proj."""
    num_experts, k = gate_up_proj.shape[0], topk_ids.shape[1]
    flat_ids = topk_ids.reshape(-1)
    if flat_ids.numel() == 0:
        return torch.zeros_like(hidden_states)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    token_idx = torch.div(order, k, rounding_mode="floor")
    x = hidden_states.index_select(0, token_idx)
    if packed is not None and usable(x[: max(counts)], (gate_up_proj, down_proj)):
        packs = (packed[0].get_each(gate_up_proj), packed[1].get_each(down_proj))
        y = _experts_one_by_one(x, counts, gate_up_proj, down_proj, packs)
    elif _few_per_expert(counts):
        y = _experts_batched(x, flat_ids.index_select(0, order), counts, gate_up_proj, down_proj)
    else:
        y = _experts_one_by_one(x, counts, gate_up_proj, down_proj)
    weights = topk_weights.reshape(-1).index_select(0, order).unsqueeze(-1)
    y = (y * weights).to(hidden_states.dtype)
    return _sum_in_expert_order(y, order, topk_ids)


def _few_per_expert(counts: list[int]) -> bool:
    # Padded batched matmuls spread over threads, where each expert's own matmul is too small.
    most = max(counts)
    few = most <= _BATCHED_MAX_ROWS and len(counts) * most <= 4 * sum(counts)
    return few and torch.get_num_threads() > 1


def _experts_one_by_one(
    x: torch.Tensor,
    counts: list[int],
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    packs: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]] | None = None,
) -> torch.Tensor:
    ys = []
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = x[start : start + n]
        if packs is None:
            gate, up = F.linear(rows, gate_up_proj[e]).chunk(2, dim=-1)
            ys.append(F.linear(F.silu(gate) * up, down_proj[e]))
        else:
            gate, up = packed_matmul(rows, packs[0][e]).chunk(2, dim=-1)
            ys.append(packed_matmul(F.silu(gate) * up, packs[1][e]))
        start += n
    return torch.cat(ys)


def _experts_batched(
    x: torch.Tensor,
    sorted_ids: torch.Tensor,
    counts: list[int],
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    E, m = len(counts), max(counts)
    starts = torch.tensor([0] + counts[:-1], device=x.device).cumsum(0)
    rank = torch.arange(x.shape[0], device=x.device) - starts[sorted_ids]
    slots = sorted_ids * m + rank
    padded = x.new_zeros(E * m, x.shape[1]).index_copy_(0, slots, x).view(E, m, -1)
    gate, up = torch.bmm(padded, gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(F.silu(gate) * up, down_proj.transpose(1, 2))
    return y.view(E * m, -1).index_select(0, slots)


def _sum_in_expert_order(
    y: torch.Tensor, order: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    # Adds rounded as the reference's index_add_ per expert (one with repeated rows differs).
    T, k = topk_ids.shape
    rank = topk_ids.argsort(dim=1).argsort(dim=1).reshape(-1)
    dest = torch.div(order, k, rounding_mode="floor") * k + rank.index_select(0, order)
    by_rank = torch.empty_like(y).index_copy_(0, dest, y).view(T, k, -1)
    out = by_rank[:, 0].clone()
    for r in range(1, k):
        out += by_rank[:, r]
    return out
