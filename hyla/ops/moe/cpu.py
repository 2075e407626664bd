"""Routed experts with the tokens grouped once: the fast path of `reference.moe_experts` (same
signature and results; tests/ops/test_moe_routing.py holds them together).

The reference finds each expert's tokens with its own `nonzero` and scatters each expert's
output separately. Here the (token, slot) pairs are sorted by expert once, so each expert reads
one contiguous slice of the gathered inputs, and the outputs come back to their tokens in one copy:

    pairs sorted by expert:  | e0: t3 t9 | e2: t0 t3 t4 | e5: t9 | ...      (stable: token order)
    out[t] = (y[e_a, t] + y[e_b, t]) + ...   a < b < ...: ascending expert order, as the reference

Each expert then runs its own two matmuls on its rows, as in the reference (bit for bit the
same), except in two cases that agree with it to fp32 rounding: with `packed` caches (fp32 CPU
inference) the matmuls run on oneDNN copies of the experts (`hyla.ops.linear`: a row's result
does not depend on the group's row count); without them, on more than one thread, decode-sized
groups run as two padded batched matmuls (threads split the experts, too small to split one by one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from hyla.ops.linear import Prepacked, packed_matmul, usable

_BATCHED_MAX_ROWS = 32  # most tokens of one expert for the padded batched form


def moe_experts(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    packed: tuple[Prepacked, Prepacked] | None = None,
) -> torch.Tensor:
    """`reference.moe_experts` with the tokens sorted by expert once.

    Args:
        hidden_states: [T, D]; gate_up_proj: [E, 2 * I, D]; down_proj: [E, D, I];
        topk_weights: [T, k]; topk_ids: [T, k] int64 in [0, E).
        packed: the `Prepacked` caches of gate_up_proj and down_proj; where usable (fp32 CPU
            inference) the experts multiply by their oneDNN copies (`hyla.ops.linear`).
    Returns: [T, D] in hidden_states' dtype.
    """
    num_experts, k = gate_up_proj.shape[0], topk_ids.shape[1]
    flat_ids = topk_ids.reshape(-1)
    if flat_ids.numel() == 0:
        return torch.zeros_like(hidden_states)
    order = torch.argsort(flat_ids, stable=True)  # pair p = token p // k, slot p % k
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    token_idx = torch.div(order, k, rounding_mode="floor")
    x = hidden_states.index_select(0, token_idx)  # [T*k, D] grouped by expert
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
    """Decode-sized groups (at most `_BATCHED_MAX_ROWS` tokens per expert, at least a quarter of
    the padded rows real) with more than one thread: one padded batched matmul over all experts
    spreads over the threads, where each expert's own matmul is too small to (on one thread
    both forms cost the same, and the loop reads only the experts in use)."""
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
    """x [P, D] rows grouped by expert (`counts[e]` rows of expert e, in order) -> [P, D];
    with `packs` (oneDNN copies of each expert's matrices, `hyla.ops.linear`) the experts
    multiply by those."""
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
    """`_experts_one_by_one` as two batched matmuls over [E, m, *] (m = most rows of an expert,
    zero rows padding the others). sorted_ids [P]: the expert of each row of x."""
    E, m = len(counts), max(counts)
    starts = torch.tensor([0] + counts[:-1], device=x.device).cumsum(0)
    rank = torch.arange(x.shape[0], device=x.device) - starts[sorted_ids]
    slots = sorted_ids * m + rank  # row of each pair in the padded [E * m] layout
    padded = x.new_zeros(E * m, x.shape[1]).index_copy_(0, slots, x).view(E, m, -1)
    gate, up = torch.bmm(padded, gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(F.silu(gate) * up, down_proj.transpose(1, 2))  # [E, m, D]
    return y.view(E * m, -1).index_select(0, slots)


def _sum_in_expert_order(
    y: torch.Tensor, order: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """out[t] = ((y_a + y_b) + y_c) + ... over token t's experts a < b < c ..., each sum rounded
    to y's dtype as the reference's one `index_add_` per expert rounds it (a single
    `index_add_` with repeated rows accumulates differently below fp32).

    y: [T*k, D] per (token, slot) pair in `order` (pairs sorted by expert). Returns [T, D]."""
    T, k = topk_ids.shape
    rank = topk_ids.argsort(dim=1).argsort(dim=1).reshape(-1)  # slot -> rank of its expert
    dest = torch.div(order, k, rounding_mode="floor") * k + rank.index_select(0, order)
    by_rank = torch.empty_like(y).index_copy_(0, dest, y).view(T, k, -1)
    out = by_rank[:, 0].clone()
    for r in range(1, k):
        out += by_rank[:, r]
    return out
