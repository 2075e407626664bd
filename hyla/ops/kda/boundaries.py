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

A round whose segments are all at most `SHORT_ROUND_TOKENS` long runs the token-by-token op
instead when the caller gives one (`recurrent_fn`): one fused kernel on CUDA instead of fla's
chunk pipeline (about ten launches and its host-side planning). Every prompt's last chunk has
such a round: the checkpoint where its last full block ends (kept so the same prompt hits
again) leaves at most one block after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

SHORT_ROUND_TOKENS = 16


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


@dataclass(frozen=True)
class Round:
    """Round r of a split call: segment r of every sequence that has one (see the module
    docstring). Device tensors are queued from pinned memory (`index_tensor`): no host sync.

    Attributes:
        rows: slice of the packed rows when the round's segments are one contiguous run (one
            sequence: the usual prefill), else [T_r] int64 device rows.
        seqs: None when every sequence of the call takes part in call order, else [N_r] int64
            device positions of the segments' sequences in the call.
        cu_seqlens, cu_seqlens_cpu: [N_r + 1] int64 offsets of the segments (device, host): the
            same objects in every layer, so fla's identity-memoized chunk plans hit.
        done_src, done_dst: segments ending at a boundary (positions within the round) and
            their rows of `boundary_states`; None when none ends at one.
        max_len: the longest segment's tokens.
    """

    rows: slice | torch.Tensor
    seqs: torch.Tensor | None
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    done_src: torch.Tensor | None
    done_dst: torch.Tensor | None
    max_len: int


@dataclass(frozen=True)
class BoundaryPlan(Sequence):
    """The rounds of a split call, computed once per step on the host and shared by every
    linear layer (the layers run the same sequences with the same boundaries). A Sequence of
    the per-sequence boundary lists, so it is accepted wherever `state_boundaries` is.

    Attributes:
        boundaries: per sequence, the token counts b inside (0, len) (ascending).
        lens: tokens of each sequence in the call.
        rounds: `Round`s in order (most boundaries in one sequence + 1 of them).
        device: where the index tensors live.
    """

    boundaries: tuple[tuple[int, ...], ...]
    lens: tuple[int, ...]
    rounds: tuple[Round, ...]
    device: torch.device

    def __getitem__(self, i):
        return self.boundaries[i]

    def __len__(self) -> int:
        return len(self.boundaries)

    @property
    def num_boundaries(self) -> int:
        return sum(len(b) for b in self.boundaries)


def plan_rounds(
    cu_seqlens_host: Sequence[int] | torch.Tensor,
    state_boundaries: Sequence[Sequence[int]],
    device: torch.device | str,
) -> BoundaryPlan:
    """The rounds splitting a call with host offsets `cu_seqlens_host` [N + 1] at
    `state_boundaries` (checked as in `check_boundaries`), index tensors on `device`."""
    from hyla.forward_batch import index_tensor  # the engine's pinned host -> device copy

    if isinstance(cu_seqlens_host, torch.Tensor):  # a host tensor: no sync
        cu_seqlens_host = cu_seqlens_host.tolist()
    bounds = [int(b) for b in cu_seqlens_host]
    N = len(bounds) - 1
    lens = [bounds[i + 1] - bounds[i] for i in range(N)]
    marks = [tuple(int(b) for b in bs) for bs in state_boundaries]
    if len(marks) != N:
        raise ValueError(f"state_boundaries: {len(marks)} lists for {N} seqs")
    for i, (bs, n) in enumerate(zip(marks, lens, strict=True)):
        if list(bs) != sorted(set(bs)) or any(not 0 < b < n for b in bs):
            raise ValueError(f"state_boundaries[{i}]: {list(bs)} not ascending inside (0, {n})")
    edges = [[0, *bs, n] for bs, n in zip(marks, lens, strict=True)]
    first_row = _first_rows([len(bs) for bs in marks])
    rounds = []
    for r in range(max((len(e) - 1 for e in edges), default=0)):
        seqs = [i for i in range(N) if len(edges[i]) - 1 > r]
        spans = [(bounds[i] + edges[i][r], bounds[i] + edges[i][r + 1]) for i in seqs]
        contiguous = all(spans[j][1] == spans[j + 1][0] for j in range(len(spans) - 1))
        if contiguous:
            rows: slice | torch.Tensor = slice(spans[0][0], spans[-1][1])
        else:
            rows = index_tensor([t for lo, hi in spans for t in range(lo, hi)], device)
        cu = [0]
        for lo, hi in spans:
            cu.append(cu[-1] + hi - lo)
        done = [(n, i) for n, i in enumerate(seqs) if r < len(edges[i]) - 2]
        rounds.append(Round(
            rows=rows,
            seqs=None if seqs == list(range(N)) else index_tensor(seqs, device),
            cu_seqlens=index_tensor(cu, device),
            cu_seqlens_cpu=torch.tensor(cu, dtype=torch.int64),
            done_src=index_tensor([n for n, _ in done], device) if done else None,
            done_dst=index_tensor([first_row[i] + r for _, i in done], device) if done else None,
            max_len=max(hi - lo for lo, hi in spans),
        ))  # fmt: skip
    return BoundaryPlan(tuple(marks), tuple(lens), tuple(rounds), torch.device(device))


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
    state_boundaries: Sequence[Sequence[int]] | BoundaryPlan,
    boundary_states: torch.Tensor | None,
    inplace_state: bool = False,
    cu_seqlens_cpu: torch.Tensor | None = None,
    recurrent_fn=None,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_fn(q, k, v, g, beta, cu_seqlens, initial_state, ...)` with the states after each
    sequence's `state_boundaries` written into `boundary_states` (see the module docstring);
    rounds of short segments go to `recurrent_fn` (same positional arguments) when given.
    A `BoundaryPlan` (the engine builds one per step, `plan_rounds`) is used as it is; plain
    lists are planned here (reading `cu_seqlens` back unless `cu_seqlens_cpu` is given).
    Shapes as in `hyla.ops.kda.reference.chunk_kda`; returns its (o, final_state)."""
    plan = state_boundaries
    if not isinstance(plan, BoundaryPlan) or plan.device != v.device:
        host = (cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu).tolist()
        plan = plan_rounds(host, state_boundaries, v.device)
    N, (HV, V), K = len(plan), v.shape[1:], q.shape[-1]
    if sum(plan.lens) != v.shape[0]:
        raise ValueError(f"state_boundaries: planned for {sum(plan.lens)} rows, got {v.shape[0]}")
    check_boundaries(plan.boundaries, list(plan.lens), boundary_states, (HV, K, V))
    if initial_state is None:
        state = torch.zeros(N, HV, K, V, dtype=torch.float32, device=v.device)
    else:
        state = initial_state.float().clone()
    o = torch.empty_like(v)
    for rnd in plan.rounds:
        sub = tuple(_take(x, rnd.rows) for x in (q, k, v, g, beta))
        init = state if rnd.seqs is None else state.index_select(0, rnd.seqs)
        if recurrent_fn is not None and rnd.max_len <= SHORT_ROUND_TOKENS:
            o_r, final_r = recurrent_fn(*sub, rnd.cu_seqlens, init, scale, use_qk_l2norm)
        else:
            o_r, final_r = chunk_fn(
                *sub, rnd.cu_seqlens, init, scale, use_qk_l2norm,
                cu_seqlens_cpu=rnd.cu_seqlens_cpu, **options,
            )  # fmt: skip
        if isinstance(rnd.rows, slice):
            o[rnd.rows] = o_r
        else:
            o.index_copy_(0, rnd.rows, o_r)
        final_r = final_r.float()
        if rnd.seqs is None:
            state = final_r
        else:
            state.index_copy_(0, rnd.seqs, final_r)
        if rnd.done_src is not None:  # segment r of these ended at their r-th boundary
            boundary_states.index_copy_(0, rnd.done_dst, final_r.index_select(0, rnd.done_src))
    if inplace_state and initial_state is not None and initial_state.dtype == torch.float32:
        return o, initial_state.copy_(state)
    return o, state


def _take(x: torch.Tensor, rows: slice | torch.Tensor) -> torch.Tensor:
    return x[rows] if isinstance(rows, slice) else x.index_select(0, rows)


def _first_rows(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out
