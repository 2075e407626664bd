"""States at interior boundaries of a chunked delta-rule call (prefix-cache checkpoints).

`state_boundaries[i]` lists token counts b (0 < b < len_i, ascending) of sequence i of a packed
call; the state after exactly b of its tokens is written, sequence-major, into rows of
`boundary_states: [M, HV, K, V]` float32 (M = total boundaries). The reference computes them in
its own chunk loop (chunks restart at every boundary); the fast CPU path and the fla kernels run
the call as rounds of sub-calls split at the boundaries, every sequence's r-th segment in round r
(sequences advance together, each round's final states are the next round's initial states):

    sequence 0   |--seg 0--b|----seg 1----b|--seg 2--|
    sequence 1   |-----seg 0-----b|--seg 1--|
                  round 0          round 1    round 2

A boundary is a multiple of the checkpoint stride; the chunked kernels (fla's 64-token chunks)
compute the state at every chunk start anyway, but relative to the sequence's first new token,
which is a stride multiple only when the context is: splitting needs no such alignment and only
the public chunk entry (one call per round; rounds = most boundaries in one sequence + 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_boundaries(
    state_boundaries: Sequence[Sequence[int]],
    lens: list[int],
    boundary_states: torch.Tensor | None,
    state_shape: tuple[int, ...],
) -> int:
    """Raise ValueError unless every sequence's boundaries are ascending inside (0, len) and
    `boundary_states` is [M, *state_shape]; returns M."""
    if len(state_boundaries) != len(lens):
        raise ValueError(f"state_boundaries: {len(state_boundaries)} lists for {len(lens)} seqs")
    for i, (bs, n) in enumerate(zip(state_boundaries, lens, strict=True)):
        if list(bs) != sorted(set(bs)) or any(not 0 < b < n for b in bs):
            raise ValueError(f"state_boundaries[{i}]: {list(bs)} not ascending inside (0, {n})")
    M = sum(len(bs) for bs in state_boundaries)
    if M == 0 and boundary_states is None:
        return 0
    if boundary_states is None or tuple(boundary_states.shape) != (M, *state_shape):
        got = None if boundary_states is None else tuple(boundary_states.shape)
        raise ValueError(f"boundary_states: shape {got} != {(M, *state_shape)}")
    return M


def split_at_boundaries(
    chunk_fn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    scale: float | None,
    use_qk_l2norm: bool,
    *,
    state_boundaries: Sequence[Sequence[int]],
    boundary_states: torch.Tensor | None,
    inplace_state: bool = False,
    cu_seqlens_cpu: torch.Tensor | None = None,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_fn(q, k, v, g, beta, cu_seqlens, initial_state, ...)` with the states after each
    sequence's `state_boundaries` written into `boundary_states` (see the module docstring).
    Shapes as in `hyla.ops.kda.reference.chunk_kda`; returns its (o, final_state)."""
    bounds = (cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu).tolist()
    N, (HV, V), K = len(bounds) - 1, v.shape[1:], q.shape[-1]
    lens = [bounds[i + 1] - bounds[i] for i in range(N)]
    check_boundaries(state_boundaries, lens, boundary_states, (HV, K, V))
    edges = [[0, *bs, n] for bs, n in zip(state_boundaries, lens, strict=True)]
    first_row = _first_rows([len(bs) for bs in state_boundaries])
    if initial_state is None:
        state = torch.zeros(N, HV, K, V, dtype=torch.float32, device=v.device)
    else:
        state = initial_state.float().clone()
    o = torch.empty_like(v)
    for r in range(max((len(e) - 1 for e in edges), default=0)):
        seqs = [i for i in range(N) if len(edges[i]) - 1 > r]
        spans = [(bounds[i] + edges[i][r], bounds[i] + edges[i][r + 1]) for i in seqs]
        rows = _ints([t for lo, hi in spans for t in range(lo, hi)], v.device)
        sub_host = torch.tensor([0, *(hi - lo for lo, hi in spans)]).cumsum(0).to(torch.int32)
        idx = _ints(seqs, v.device)
        sub = (q[rows], k[rows], v[rows], g[rows], beta[rows])
        o_r, final_r = chunk_fn(
            *sub, sub_host.to(v.device), state[idx], scale, use_qk_l2norm,
            cu_seqlens_cpu=sub_host, **options,
        )  # fmt: skip
        o[rows] = o_r
        state[idx] = final_r
        done = [(n, i) for n, i in enumerate(seqs) if r < len(edges[i]) - 2]
        if done:  # segment r of these ended at their r-th boundary
            src = _ints([n for n, _ in done], v.device)
            dst = _ints([first_row[i] + r for _, i in done], v.device)
            boundary_states.index_copy_(0, dst, final_r.float().index_select(0, src))
    if inplace_state and initial_state is not None and initial_state.dtype == torch.float32:
        return o, initial_state.copy_(state)
    return o, state


def _first_rows(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def _ints(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)
