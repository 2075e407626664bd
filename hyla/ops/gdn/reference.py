"""Gated DeltaNet: the gated delta rule with one scalar decay per value head and token.

Source: Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule"
(arXiv 2412.06464), eq. (10), and `torch_recurrent_gated_delta_rule` /
`torch_chunk_gated_delta_rule` in transformers' `models/qwen3_next/modeling_qwen3_next.py`.
Per value head, with state S [K, V]:

    S_t = exp(g_t) S_{t-1};   u_t = beta_t (v_t - S_t^T k_t)
    S_t = S_t + k_t u_t^T;    o_t = S_t^T q_t

This is KDA (`hyla.ops.kda`) with the same decay on every key channel, so both functions here
broadcast g over K and call the KDA reference: one definition of the recurrence, one of the
chunked form. Conventions (packed varlen, fp32 compute, fp32 states) are those of `hyla.ops.kda`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.kda.reference import check_delta_inputs, chunk_kda, recurrent_kda


def _per_channel(g: torch.Tensor, head_k_dim: int) -> torch.Tensor:
    return g.unsqueeze(-1).expand(*g.shape, head_k_dim)  # [T, HV] -> [T, HV, K]


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule token by token in fp32 (the definition).

    Args:
        q, k: [T, H, K] queries and keys.
        v: [T, HV, V] values; HV is a multiple of H (GVA: value head j reads key head
            j // (HV // H)).
        g: [T, HV] log-space decay per head (<= 0).
        beta: [T, HV] write strength of each token.
        cu_seqlens: [N + 1] int32 offsets of the packed sequences.
        initial_state: [N, HV, K, V] state before each sequence, or None for zeros.
        scale: query scale, default K^-0.5.
        use_qk_l2norm: L2-normalize q and k per head first (in fp32).
    Returns:
        o: [T, HV, V] in v's dtype; final_state: [N, HV, K, V] float32.
    Raises:
        ValueError: inconsistent shapes.
    """
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=2)
    g = _per_channel(g, q.shape[-1])
    return recurrent_kda(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    *,
    chunk_size: int = 64,
    state_boundaries: Sequence[Sequence[int]] | None = None,
    boundary_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule in chunks; same arguments and results as `recurrent_gated_delta_rule`
    (equal up to fp32 rounding); `state_boundaries` / `boundary_states` as in
    `hyla.ops.kda.reference.chunk_kda`.

    Raises:
        ValueError: inconsistent shapes, or chunk_size < 1.
    """
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=2)
    g = _per_channel(g, q.shape[-1])
    return chunk_kda(
        q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm, chunk_size=chunk_size,
        state_boundaries=state_boundaries, boundary_states=boundary_states,
    )  # fmt: skip
