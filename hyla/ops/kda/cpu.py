"""KDA vectorized over sequences (`reference.py`'s results within 1e-5 fp32, batch-invariant).
Last chunks are padded with zero q, k, v, g, beta rows, which decay and write nothing."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.kda.boundaries import split_at_boundaries
from hyla.ops.kda.chunk_algebra import ChunkLayout, inter_chunk, intra_chunk
from hyla.ops.kda.reference import _initial, check_delta_inputs, prepare_qk


def _state(
    initial_state: torch.Tensor | None, N: int, shape: tuple, device: torch.device, inplace: bool
) -> torch.Tensor:
    if inplace and initial_state is not None and initial_state.dtype == torch.float32:
        return initial_state
    return _initial(initial_state, N, *shape, device).clone()


def recurrent_kda(
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
    """`reference.recurrent_kda` with all sequences stepped together."""
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=3)
    T, HV, V = v.shape
    K = q.shape[-1]
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    vf, decay, bf = v.float(), g.float().exp(), beta.float()
    bounds = cu_seqlens.tolist()
    N = len(bounds) - 1
    lens = [bounds[i + 1] - bounds[i] for i in range(N)]
    state = _state(initial_state, N, (HV, K, V), v.device, inplace_state)
    o = torch.empty(T, HV, V, dtype=torch.float32, device=v.device)
    for t in range(max(lens, default=0)):
        seqs = [i for i in range(N) if lens[i] > t]
        if len(seqs) == N and T == N:  # one token per sequence: rows are the sequences
            o[:] = _recurrent_update(state, qf, kf, vf, decay, bf)
            continue
        rows = torch.tensor([bounds[i] + t for i in seqs], device=v.device)
        idx = torch.tensor(seqs, device=v.device)
        s = state.index_select(0, idx)
        o[rows] = _recurrent_update(s, qf[rows], kf[rows], vf[rows], decay[rows], bf[rows])
        state.index_copy_(0, idx, s)
    return o.to(v.dtype), state


def _recurrent_update(
    s: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
) -> torch.Tensor:
    kq = torch.stack([k, q], dim=2) * decay.unsqueeze(2)
    read = kq @ s
    u = beta.unsqueeze(-1) * (v - read[:, :, 0])
    s.mul_(decay.unsqueeze(-1)).add_(k.unsqueeze(-1) * u.unsqueeze(-2))
    return read[:, :, 1] + (q * k).sum(-1, keepdim=True) * u


def chunk_kda(
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
    """`reference.chunk_kda` with all chunks batched, in fp32 (chunks of 16 keep the triangular
    solve as accurate as the recurrence). `cu_seqlens_cpu` is unused (kernels' signature)."""
    if state_boundaries is not None and any(state_boundaries):
        return split_at_boundaries(
            chunk_kda, q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm,
            state_boundaries=state_boundaries, boundary_states=boundary_states,
            inplace_state=inplace_state, chunk_size=chunk_size, recurrent_fn=recurrent_kda,
        )  # fmt: skip
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=3)
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    T, HV, V = v.shape
    K = q.shape[-1]
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    bounds = cu_seqlens.tolist()
    N = len(bounds) - 1
    layout = ChunkLayout(bounds, chunk_size, v.device)
    qc, kc, vc, gc = (layout.pad(x) for x in (qf, kf, v.float(), g.float()))
    bc = layout.pad(beta.float().unsqueeze(-1)).squeeze(-1)
    pieces = intra_chunk(qc, kc, vc, gc, bc)
    state = _state(initial_state, N, (HV, K, V), v.device, inplace_state)
    ranked = state.index_select(0, layout.order)
    oc = torch.empty(layout.num_chunks, HV, chunk_size, V, dtype=torch.float32, device=v.device)
    for chunks, active in layout.steps():
        s = ranked[:active]
        oc[chunks], s_new = inter_chunk(s, *(x[chunks] for x in pieces))
        s.copy_(s_new)
    state.index_copy_(0, layout.order, ranked)
    return layout.unpad(oc).to(v.dtype), state
