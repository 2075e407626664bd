"""Routed experts on a GPU for decode-sized batches, with no host sync: `cpu.moe_experts`
(`reference.moe_experts`'s grouped form) needs each expert's token count on the host
(`bincount().tolist()`, a device sync per MoE layer per step, and a Python loop over the experts
in use). Here the shapes depend only on T, k and E, so a decode step never waits for the GPU
and the same ops could be captured in a CUDA graph. Pure PyTorch (any device; the tests run it
on the CPU against the reference).

Forms, picked from host ints (T tokens, k slots, E experts, P = T * k pairs):

  P <= E, triton    `gemv.moe_gemv`: Triton GEMVs reading each pair's expert in place (no copy),
                    weighted sum fused; bytes ~ P experts read once
  3 P <= E          gathered: each (token, slot) pair copies its expert's matrices
                    (`index_select` on the fused [E, ...] weights) and runs one batched GEMV;
                    bytes ~ 3 P experts (read, write, read), no FLOP wasted
  T E <= 8192       dense: every expert over every token (two bmm over [E, T, *]), then each
                    token keeps its k experts' outputs (with triton: `gemv.combine`, one kernel
                    for the selection and the weighted sum); bytes ~ E experts read once, E / k
                    times the FLOPs (bounded by the T E limit)
  otherwise, triton `grouped.moe_experts`: pairs sorted by expert on the device, one
                    grouped-GEMM launch per projection (prefill and mixed steps; no sync)
  otherwise         `cpu.moe_experts` (autograd on, or no triton: one sync per call)

The limits are first guesses from byte and FLOP counts, not yet measured on a GPU.

Each token's k outputs are weighted, rounded to the hidden dtype and summed in ascending expert
order, as the reference sums them.
"""

from __future__ import annotations

import torch

from hyla.ops.activation import silu_and_mul, silu_and_mul_clamped
from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.moe.cpu import moe_experts as grouped_moe_experts

DENSE_MAX_ROWS = 8192  # T * E expert rows of the dense form


def sync_free(num_tokens: int, topk: int, num_experts: int) -> bool:
    """Whether `moe_experts` on T = num_tokens CUDA rows (triton installed) takes one of the
    GEMV / gathered / dense forms rather than the grouped GEMM (`grouped.py`, sync-free too)."""
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
    """`reference.moe_experts` (same arguments and result to fp32 rounding), sync-free for
    T * E <= `DENSE_MAX_ROWS`; `packed` is only used by the `cpu.moe_experts` fallback;
    `limit`: the clamped SwiGLU of `hyla.ops.moe_clamped` (same forms).

    Shapes: hidden_states [T, D]; gate_up_proj [E, 2 * I, D]; down_proj [E, D, I];
    topk_weights [T, k]; topk_ids [T, k] int64 in [0, E), distinct within a row.
    Returns: [T, D] in hidden_states' dtype.
    """
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
    """[T, k, D]: pair (t, j) through expert topk_ids[t, j], one batched GEMV per matrix."""
    T, k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    rows = x.repeat_interleave(k, dim=0).unsqueeze(1)  # [P, 1, D], pair p = token p // k
    w1 = gate_up_proj.index_select(0, flat)  # [P, 2I, D]
    gate_up = torch.bmm(rows, w1.transpose(1, 2))  # [P, 1, 2I]
    w2 = down_proj.index_select(0, flat)  # [P, D, I]
    return torch.bmm(_activation(gate_up, limit), w2.transpose(1, 2)).view(T, k, -1)


def _dense(
    x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, limit: float | None
) -> torch.Tensor:
    """[E, T, D]: every expert over every token (two bmm; `silu_and_mul` between them)."""
    num_experts = gate_up_proj.shape[0]
    rows = x.unsqueeze(0).expand(num_experts, -1, -1)  # [E, T, D]
    gate_up = torch.bmm(rows, gate_up_proj.transpose(1, 2))  # [E, T, 2I]
    return torch.bmm(_activation(gate_up, limit), down_proj.transpose(1, 2))


def _select(y: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """[T, k, D]: each token's k chosen outputs of the dense [E, T, D] outputs."""
    tokens = torch.arange(y.shape[1], device=y.device).unsqueeze(1)  # [T, 1]
    return y[topk_ids, tokens]


def _weighted_sum(
    y: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """sum_j w[t, j] * y[t, j] over a token's experts in ascending index order, each term
    rounded to `dtype` first (the reference's per-expert `index_add_`). y: [T, k, D]."""
    terms = (y * topk_weights.unsqueeze(-1)).to(dtype)
    order = topk_ids.argsort(dim=1)  # ids are distinct within a row
    terms = terms.gather(1, order.unsqueeze(-1).expand_as(terms))
    out = terms[:, 0].clone()
    for r in range(1, terms.shape[1]):
        out += terms[:, r]
    return out
