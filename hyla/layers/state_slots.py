"""A packed step's trip through the linear layers' state slots: read each sequence's slot,
run the short conv / delta rule over the step, write the new states back.

    batch.caches[layer_idx]["recurrent_state"]  [num_slots, HV, K, V] float32
    batch.caches[layer_idx]["conv_state"]       [num_slots, C, W - 1]

Sequence i owns slot `batch.state_indices[i]`; the slot of a sequence without context
(`context_lens[i] == 0`) is never read (it may hold garbage, NaN included).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hyla.forward_batch import ForwardBatch, LayerCache, index_tensor
from hyla.ops.gpu import triton_runs_on
from hyla.ops.short_conv import causal_conv1d, conv_states_at

DeltaRuleFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def read_slots(cache: LayerCache, name: str, batch: ForwardBatch) -> torch.Tensor:
    """This step's sequences' rows of cache[name]; zeros for sequences without context."""
    rows = cache[name].index_select(0, batch.state_indices)
    fresh = [i for i, has_state in enumerate(batch.has_initial_state) if not has_state]
    if fresh:
        rows.index_fill_(0, index_tensor(fresh, rows.device), 0)
    return rows


def short_conv_step(
    mixed: torch.Tensor, weight: torch.Tensor, cache: LayerCache, batch: ForwardBatch
) -> torch.Tensor:
    """SiLU short conv of `mixed` [T, C] (weight [C, W]) continuing each sequence's conv state;
    writes the new states back to their slots. Returns [T, C]. A pure decode step where the
    Triton kernel runs (CUDA) reads and writes the slots in place in one launch."""
    pool = cache["conv_state"]
    if _is_pure_decode(batch) and triton_runs_on(pool):
        from hyla.ops.short_conv import kernels

        return kernels.conv_update_slots(mixed, weight, None, pool, batch.state_indices, "silu")
    state = read_slots(cache, "conv_state", batch)
    if batch.state_boundaries is not None:  # checkpoints inside the chunks
        W = weight.shape[-1]
        inside = conv_states_at(mixed, batch.cu_seqlens_host, state, batch.state_boundaries, W)
        pool.index_copy_(0, batch.boundary_rows, inside.to(pool.dtype))
    out, new_state = causal_conv1d(
        mixed, weight, None, batch.cu_seqlens, state, "silu", cu_seqlens_host=batch.cu_seqlens_host
    )
    cache["conv_state"].index_copy_(0, batch.state_indices, new_state)
    return out


def _is_pure_decode(batch: ForwardBatch) -> bool:
    """One token per sequence, every sequence with a state to continue from."""
    lens = batch.query_lens
    return bool(lens) and all(n == 1 for n in lens) and all(batch.has_initial_state)


def _token_rows(bounds: list[int], seqs: list[int], device: torch.device) -> torch.Tensor:
    rows = [r for i in seqs for r in range(bounds[i], bounds[i + 1])]
    return index_tensor(rows, device)


def _slot_range(
    batch: ForwardBatch, states: torch.Tensor
) -> tuple[slice, torch.Tensor | None] | None:
    """When this step's state slots are exactly the rows lo .. lo + N - 1 (fp32 states), that
    range and the batch positions in slot order (None if already in order); else None. Always
    None for a static-shape step, whose host slots are capture-time placeholders."""
    if batch.static_shapes:
        return None
    slots = batch.state_indices_host
    lo = min(slots)
    if states.dtype != torch.float32 or sorted(slots) != list(range(lo, lo + len(slots))):
        return None
    if slots == list(range(lo, lo + len(slots))):
        return slice(lo, lo + len(slots)), None
    order = sorted(range(len(slots)), key=slots.__getitem__)
    return slice(lo, lo + len(slots)), index_tensor(order, states.device)


def _decode_in_place(
    recurrent_fn: DeltaRuleFn,
    inputs: tuple[torch.Tensor, ...],
    cache: LayerCache,
    batch: ForwardBatch,
    rows: slice,
    order: torch.Tensor | None,
) -> torch.Tensor:
    """A pure decode step whose slots are a contiguous range: the recurrent op updates that
    slice of the state tensor in place (no gather, no scatter); inputs (q, k, v, g, beta) and
    the output are permuted to slot order and back when the batch lists the slots unsorted."""
    if order is not None:
        inputs = tuple(x.index_select(0, order) for x in inputs)
    state = cache["recurrent_state"][rows]  # a view: updated in place
    o, _ = recurrent_fn(*inputs, batch.cu_seqlens, state, use_qk_l2norm=True, inplace_state=True)
    return o if order is None else torch.empty_like(o).index_copy_(0, order, o)


def delta_rule_step(
    chunk_fn: DeltaRuleFn,
    recurrent_fn: DeltaRuleFn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cache: LayerCache,
    batch: ForwardBatch,
) -> torch.Tensor:
    """Run the delta rule over a packed step from each sequence's slot state and write the final
    states back. Multi-token sequences go through `chunk_fn`, single tokens `recurrent_fn`; a
    step of only one or only the other is one call, and a decode step updates its slots in place
    (on CUDA any slots, through the op's `state_indices`; elsewhere a contiguous range of an
    eager step's host slots).

    Shapes: q, k [T, H, K]; v [T, HV, V]; g [T, HV(, K)]; beta [T, HV]. Returns o [T, HV, V].
    """
    lens = batch.query_lens
    pool = cache["recurrent_state"]
    inside = _boundary_buffer(batch, pool)
    if _is_pure_decode(batch):
        if pool.is_cuda:  # the op reads and writes the slots in place (fla), no host sync
            o, _ = recurrent_fn(
                q, k, v, g, beta, batch.cu_seqlens, pool, use_qk_l2norm=True,
                inplace_state=True, state_indices=batch.state_indices,
            )  # fmt: skip
            return o
        in_place = _slot_range(batch, pool)
        if in_place is not None:
            return _decode_in_place(recurrent_fn, (q, k, v, g, beta), cache, batch, *in_place)
    state = read_slots(cache, "recurrent_state", batch)  # [N, HV, K, V]
    if lens and (all(n == 1 for n in lens) or all(n > 1 for n in lens)):  # one op, no regrouping
        args = (q, k, v, g, beta, batch.cu_seqlens, state)
        if lens[0] == 1:
            o, final = recurrent_fn(*args, use_qk_l2norm=True, inplace_state=True)
        else:  # the host offsets spare the op a device sync (see `kda.kernels.chunk_kda`)
            host = batch.shared("cu_seqlens_cpu", lambda: torch.tensor(batch.cu_seqlens_host))
            extra = _boundary_args(batch, inside, range(len(lens)))
            o, final = chunk_fn(
                *args, use_qk_l2norm=True, inplace_state=True, cu_seqlens_cpu=host, **extra
            )
        _write_boundaries(pool, batch, inside)
        cache["recurrent_state"].index_copy_(0, batch.state_indices, final)
        return o
    final = state.clone()
    o = torch.zeros_like(v)
    bounds = batch.cu_seqlens_host
    for fn, seqs in (
        (recurrent_fn, [i for i, n in enumerate(lens) if n == 1]),
        (chunk_fn, [i for i, n in enumerate(lens) if n > 1]),
    ):
        if not seqs:
            continue
        rows = _token_rows(bounds, seqs, v.device)
        sub_cu = torch.tensor([0] + [lens[i] for i in seqs]).cumsum(0, dtype=torch.int32)
        idx = index_tensor(seqs, v.device)
        extra = {"cu_seqlens_cpu": sub_cu} if fn is chunk_fn else {}
        if fn is chunk_fn:  # only multi-token sequences have boundaries inside their chunk
            extra.update(_boundary_args(batch, inside, seqs))
        sub_cu_dev = index_tensor(sub_cu.tolist(), v.device, torch.int32)
        sub = (q[rows], k[rows], v[rows], g[rows], beta[rows], sub_cu_dev, state[idx])
        o_sub, final_sub = fn(*sub, use_qk_l2norm=True, **extra)
        o[rows] = o_sub
        final[idx] = final_sub
    _write_boundaries(pool, batch, inside)
    cache["recurrent_state"].index_copy_(0, batch.state_indices, final)
    return o


def _boundary_buffer(batch: ForwardBatch, pool: torch.Tensor) -> torch.Tensor | None:
    """[M, HV, K, V] fp32 for the states at `batch.state_boundaries` (None when there are none;
    a single-token sequence has none, so a pure decode step never does)."""
    if batch.state_boundaries is None:
        return None
    M = sum(len(b) for b in batch.state_boundaries)
    return torch.empty(M, *pool.shape[1:], dtype=torch.float32, device=pool.device)


def _boundary_args(batch: ForwardBatch, inside: torch.Tensor | None, seqs) -> dict:
    """The chunk op's boundary arguments for the batch positions `seqs` (every multi-token
    sequence, in batch order: the others have no boundaries, so all rows of `inside` are
    theirs)."""
    if inside is None:
        return {}
    return {
        "state_boundaries": [batch.state_boundaries[i] for i in seqs],
        "boundary_states": inside,
    }


def _write_boundaries(pool: torch.Tensor, batch: ForwardBatch, inside: torch.Tensor | None) -> None:
    if inside is not None:
        pool.index_copy_(0, batch.boundary_rows, inside.to(pool.dtype))
