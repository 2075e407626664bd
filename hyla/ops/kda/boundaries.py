"""States at interior boundaries of a chunked delta-rule call (prefix-cache checkpoints), run as
rounds split at the boundaries: fla's chunk-start states are not aligned to the stride."""

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
    """Raise ValueError unless boundaries ascend inside (0, len) and `boundary_states` is
    [M, *state_shape]; returns M."""
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
    """Round r of a split call: segment r of every sequence that has one. cu_seqlens(_cpu) are
    the same objects in every layer (fla's chunk plans are memoized by identity);
    done_src/done_dst: segments ending at a boundary and their `boundary_states` rows."""

    rows: slice | torch.Tensor
    seqs: torch.Tensor | None
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    done_src: torch.Tensor | None
    done_dst: torch.Tensor | None
    max_len: int


@dataclass(frozen=True)
class BoundaryPlan(Sequence):
    """A step's rounds, shared by its linear layers; also a Sequence of the boundary lists."""

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
    """Rounds splitting a call with host offsets `cu_seqlens_host` [N + 1] at `state_boundaries`."""
    from hyla.ops.gpu import index_tensor

    if isinstance(cu_seqlens_host, torch.Tensor):
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
    """`chunk_fn(q, k, v, g, beta, cu_seqlens, initial_state, ...)`, writing the states after
    `state_boundaries` into `boundary_states: [M, HV, K, V]`; rounds of <= `SHORT_ROUND_TOKENS`
    go to `recurrent_fn` (one fused kernel instead of fla's ~10 launches)."""
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
        if rnd.done_src is not None:
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
