"""Gated DeltaNet on CUDA through fla-core's Triton kernels; conventions, precision and the
hyla -> fla mapping are those of `hyla.ops.kda.kernels`, with g [T, HV] one log-decay per head.

`chunk_gated_delta_rule` calls `fla.ops.gated_delta_rule.chunk_gated_delta_rule` (scalar decay
per head, g in log space: fla's default, use_gate_in_kernel=False).

`recurrent_gated_delta_rule` runs fla's fused recurrent *KDA* kernel with g broadcast over K,
as `reference.py` defines GDN: fla's own `fused_recurrent_gated_delta_rule` can neither update
a state in place nor address a state pool, so a decode step through it would read and write
every state twice more (copy-back or gather/scatter). The broadcast g costs one small copy
([T, HV, K], the size of k's rows per value head).
"""

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
    """Gated delta rule token by token (`reference.recurrent_gated_delta_rule`: same math,
    arguments and results). g: [T, HV] log-space decay per head (<= 0); every other argument,
    `state_indices` included, as in `hyla.ops.kda.kernels.recurrent_kda`.

    Returns:
        o: [T, HV, V] in v's dtype; final_state: [N, HV, K, V] float32 (the pool with
        `state_indices` and `inplace_state`).
    Raises:
        ValueError: inconsistent shapes.
    """
    check_step_shapes(q, k, v, g, beta, cu_seqlens, initial_state, state_indices, g_dims=2)
    g = g.unsqueeze(-1).expand(*g.shape, q.shape[-1])  # [T, HV] -> [T, HV, K]
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
    """Gated delta rule in chunks (`reference.chunk_gated_delta_rule`); g: [T, HV], the rest as
    in `hyla.ops.kda.kernels.chunk_kda` (`cu_seqlens_cpu`, `state_boundaries` and
    `boundary_states` too: split into rounds of fla calls at the boundaries).

    Args:
        chunk_size: tiling only; fla supports 16, 32 and 64, any other value runs with 64.
    Raises:
        ValueError: inconsistent shapes or cu_seqlens, or chunk_size < 1.
    """
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
