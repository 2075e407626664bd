"""KDA vectorized over sequences: the fast path, same signatures and results as `reference.py`
(held to it within 1e-5 fp32 by tests/ops/test_kda.py and tests/ops/test_kda_cpu.py).

`reference.py` visits one sequence (and one chunk, or one token) at a time; here every sequence
of a call advances together, so a step costs a handful of batched ops whatever N is:

  recurrent_kda  one batched update per token index t (a pure decode step is a single update)
  chunk_kda      all chunks' intra-chunk algebra at once (`chunk_algebra.py`), then one batched
                 state update per chunk index j across the sequences that have a chunk j

Chunks start at each sequence's first token; a sequence's last chunk is padded with
q = k = v = g = beta = 0 rows. Such a row decays nothing (exp(0) = 1), writes nothing (k = 0,
and beta = 0 makes its delta exactly 0) and its output is dropped, so padding never reaches a
state. Everything is fp32: small chunks (16) keep the triangular solve as accurate as the
recurrence, and no exponent is ever positive (see `chunk_algebra.py`).

Each sequence's arithmetic is independent of its neighbours (batched matmuls are per matrix),
so results do not depend on the batch.
"""

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
    """`reference.recurrent_kda` with all sequences stepped together (same args and results).

    Per token, with d = exp(g_t): read = [k_t * d, q_t * d]^T S_{t-1} in one matmul, then
    u = beta (v - read_k), S_t = d * S_{t-1} + k u^T and o = read_q + (q . k) u, which is the
    definition's S_t^T q expanded.

    Args:
        inplace_state: a float32 `initial_state` is updated in place and returned as the final
            state (saves a copy when the caller owns the tensor).
    """
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
    """One token of n sequences: s [n, HV, K, V] updated in place; q, k, decay [n, HV, K];
    v [n, HV, V]; beta [n, HV]. Returns o [n, HV, V]."""
    kq = torch.stack([k, q], dim=2) * decay.unsqueeze(2)  # [n, HV, 2, K]
    read = kq @ s  # [n, HV, 2, V]
    u = beta.unsqueeze(-1) * (v - read[:, :, 0])  # [n, HV, V]
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
    """`reference.chunk_kda` with all sequences' chunks batched (same args and results; fp32
    throughout, chunks of 16 by default).

    Args:
        inplace_state: as in `recurrent_kda`.
        cu_seqlens_cpu: unused here (the signature of `kernels.chunk_kda`).
        state_boundaries, boundary_states: states inside each sequence, as in
            `reference.chunk_kda` (computed by `boundaries.split_at_boundaries`).
    Raises:
        ValueError: inconsistent shapes, or chunk_size < 1.
    """
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
    # [T, HV, *] -> [C, HV, c, *]: padded chunks, heads before time
    qc, kc, vc, gc = (layout.pad(x) for x in (qf, kf, v.float(), g.float()))
    bc = layout.pad(beta.float().unsqueeze(-1)).squeeze(-1)  # [C, HV, c]
    pieces = intra_chunk(qc, kc, vc, gc, bc)
    state = _state(initial_state, N, (HV, K, V), v.device, inplace_state)
    ranked = state.index_select(0, layout.order)  # sequences by descending chunk count
    oc = torch.empty(layout.num_chunks, HV, chunk_size, V, dtype=torch.float32, device=v.device)
    for chunks, active in layout.steps():
        s = ranked[:active]
        oc[chunks], s_new = inter_chunk(s, *(x[chunks] for x in pieces))
        s.copy_(s_new)
    state.index_copy_(0, layout.order, ranked)
    return layout.unpad(oc).to(v.dtype), state
