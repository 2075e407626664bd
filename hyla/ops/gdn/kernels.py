"""Gated DeltaNet on CUDA through fla-core, as `hyla.ops.kda.kernels` with g: [T, HV]. Recurrent
steps run fla's *KDA* kernel, g broadcast over K: fla's GDN one cannot address a state pool."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.kda.boundaries import split_at_boundaries
from hyla.ops.kda.kernels import check_step_shapes, fused_recurrent, run_fla_chunk

FLA_GDN_CHUNK_SIZES = (16, 32, 64)


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
    state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.recurrent_gated_delta_rule`; args as `hyla.ops.kda.kernels.recurrent_kda`."""
    check_step_shapes(q, k, v, g, beta, cu_seqlens, initial_state, state_indices, g_dims=2)
    g = g.unsqueeze(-1).expand(*g.shape, q.shape[-1])
    return fused_recurrent(
        q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm, inplace_state,
        state_indices,
    )  # fmt: skip


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
    inplace_state: bool = False,
    cu_seqlens_cpu: torch.Tensor | None = None,
    state_boundaries: Sequence[Sequence[int]] | None = None,
    boundary_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.chunk_gated_delta_rule`, as `hyla.ops.kda.kernels.chunk_kda` (fla: 16, 32, 64)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk_gdr

    if state_boundaries is not None and any(state_boundaries):
        return split_at_boundaries(
            chunk_gated_delta_rule, q, k, v, g, beta, cu_seqlens, initial_state, scale,
            use_qk_l2norm, state_boundaries=state_boundaries, boundary_states=boundary_states,
            inplace_state=inplace_state, cu_seqlens_cpu=cu_seqlens_cpu, chunk_size=chunk_size,
            recurrent_fn=recurrent_gated_delta_rule,
        )  # fmt: skip
    inputs = (q, k, v, g, beta, cu_seqlens, initial_state)
    fla_chunk_size = chunk_size if chunk_size in FLA_GDN_CHUNK_SIZES else 64
    return run_fla_chunk(fla_chunk_gdr, inputs, 2, scale, use_qk_l2norm, chunk_size,
                         fla_chunk_size, inplace_state, cu_seqlens_cpu)  # fmt: skip
