"""Gated DeltaNet (arXiv 2412.06464 eq. 10; transformers' `modeling_qwen3_next.py`): KDA with one
decay per value head, broadcast over K, so both functions call the KDA reference."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.kda.reference import check_delta_inputs, chunk_kda, recurrent_kda


def _per_channel(g: torch.Tensor, head_k_dim: int) -> torch.Tensor:
    return g.unsqueeze(-1).expand(*g.shape, head_k_dim)


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
    """`hyla.ops.kda.reference.recurrent_kda` with g: [T, HV], log decay per head (<= 0)."""
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
    """`hyla.ops.kda.reference.chunk_kda` with g: [T, HV]."""
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=2)
    g = _per_channel(g, q.shape[-1])
    return chunk_kda(
        q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm, chunk_size=chunk_size,
        state_boundaries=state_boundaries, boundary_states=boundary_states,
    )  # fmt: skip
