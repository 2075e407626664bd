"""Gated DeltaNet on the vectorized KDA path (`hyla.ops.kda.cpu`), the decay broadcast over K."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.gdn.reference import _per_channel
from hyla.ops.kda import cpu as kda
from hyla.ops.kda.reference import check_delta_inputs


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
    *,
    inplace_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.recurrent_gated_delta_rule`, all sequences stepped together; g: [T, HV]."""
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=2)
    g = _per_channel(g, q.shape[-1])
    return kda.recurrent_kda(
        q,
        k,
        v,
        g,
        beta,
        cu_seqlens,
        initial_state,
        scale,
        use_qk_l2norm,
        inplace_state=inplace_state,
    )


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
    chunk_size: int = 16,
    inplace_state: bool = False,
    cu_seqlens_cpu: torch.Tensor | None = None,
    state_boundaries: Sequence[Sequence[int]] | None = None,
    boundary_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.chunk_gated_delta_rule`, all chunks batched; g: [T, HV]."""
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=2)
    g = _per_channel(g, q.shape[-1])
    return kda.chunk_kda(
        q,
        k,
        v,
        g,
        beta,
        cu_seqlens,
        initial_state,
        scale,
        use_qk_l2norm,
        chunk_size=chunk_size,
        inplace_state=inplace_state,
        state_boundaries=state_boundaries,
        boundary_states=boundary_states,
    )
