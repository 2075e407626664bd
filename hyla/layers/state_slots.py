"""Short conv and delta rule of a packed step over the linear layers' state slots; a sequence
without context never reads its slot (it may hold NaN)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hyla.forward_batch import ForwardBatch, LayerCache, index_tensor
from hyla.ops.gpu import triton_runs_on
from hyla.ops.kda.boundaries import plan_rounds
from hyla.ops.short_conv import causal_conv1d, conv_boundary_rows, conv_states_gather

DeltaRuleFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def read_slots(cache: LayerCache, name: str, batch: ForwardBatch) -> torch.Tensor:
    rows = cache[name].index_select(0, batch.state_indices)
    fresh = batch.shared(("fresh_state_rows", rows.device), lambda: _fresh_rows(batch, rows.device))
    if fresh is not None:
        rows.index_fill_(0, fresh, 0)
    return rows


def _fresh_rows(batch: ForwardBatch, device: torch.device) -> torch.Tensor | None:
    fresh = [i for i, has_state in enumerate(batch.has_initial_state) if not has_state]
    return index_tensor(fresh, device) if fresh else None


def short_conv_step(
    mixed: torch.Tensor, weight: torch.Tensor, cache: LayerCache, batch: ForwardBatch
) -> torch.Tensor:
    """SiLU short conv of `mixed` [T, C] (weight [C, W]) from each sequence's conv state, new
    states written back. Returns [T, C]."""
    pool = cache["conv_state"]
    if batch.attn.has_state is not None:  # static multi-token step (mixed CUDA graphs)
        return _conv_static(mixed, weight, pool, batch)
    if _is_pure_decode(batch) and triton_runs_on(pool):
        from hyla.ops.short_conv import kernels

        return kernels.conv_update_slots(mixed, weight, None, pool, batch.state_indices, "silu")
    if varlen_conv_runs(pool, batch) and batch.state_boundaries is None:
        return _conv_varlen(mixed, weight, pool, batch)
    state = read_slots(cache, "conv_state", batch)
    if batch.state_boundaries is not None:
        _write_conv_boundaries(mixed, state, weight.shape[-1], pool, batch)
        if varlen_conv_runs(pool, batch):  # the slots are read before the kernel writes them
            return _conv_varlen(mixed, weight, pool, batch)
    out, new_state = causal_conv1d(
        mixed, weight, None, batch.cu_seqlens, state, "silu", cu_seqlens_host=batch.cu_seqlens_host
    )
    cache["conv_state"].index_copy_(0, batch.state_indices, new_state)
    return out


def _conv_varlen(
    mixed: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, batch: ForwardBatch
) -> torch.Tensor:
    from hyla.ops.short_conv import varlen_kernels

    has_state = batch.shared(("has_initial_state", pool.device), lambda: index_tensor(
        [int(h) for h in batch.has_initial_state], pool.device, torch.int32))  # fmt: skip
    return varlen_kernels.conv_varlen_slots(
        mixed, weight, None, batch.cu_seqlens, pool, batch.state_indices, has_state, "silu"
    )


def _conv_static(
    mixed: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, batch: ForwardBatch
) -> torch.Tensor:
    has_state = batch.attn.has_state
    if triton_runs_on(pool):
        from hyla.ops.short_conv import varlen_kernels

        return varlen_kernels.conv_varlen_slots(
            mixed, weight, None, batch.cu_seqlens, pool, batch.state_indices, has_state, "silu"
        )
    state = _masked_rows(pool, batch)
    out, new_state = causal_conv1d(mixed, weight, None, batch.cu_seqlens, state, "silu")
    pool.index_copy_(0, batch.state_indices, new_state)
    return out


def _masked_rows(pool: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    rows = pool.index_select(0, batch.state_indices)
    fresh = (batch.attn.has_state == 0).view(-1, *([1] * (rows.dim() - 1)))
    return rows.masked_fill_(fresh, 0)


def _write_conv_boundaries(
    mixed: torch.Tensor, state: torch.Tensor, width: int, pool: torch.Tensor, batch: ForwardBatch
) -> None:
    marks, host = batch.state_boundaries, batch.cu_seqlens_host
    rows = batch.shared(("conv_boundary_rows", width, pool.device), lambda: index_tensor(
        conv_boundary_rows(host, marks, width), pool.device))  # fmt: skip
    inside = conv_states_gather(mixed, state, rows, width)
    pool.index_copy_(0, batch.boundary_rows, inside.to(pool.dtype))


def varlen_conv_runs(pool: torch.Tensor, batch: ForwardBatch) -> bool:
    """Whether a multi-token step's short conv takes the Triton kernel (patched by bench/)."""
    return triton_runs_on(pool) and batch.attn.seq_lens_host is not None


def _is_pure_decode(batch: ForwardBatch) -> bool:
    lens = batch.query_lens
    return bool(lens) and all(n == 1 for n in lens) and all(batch.has_initial_state)


@dataclass(frozen=True)
class SubBatch:
    """The sequences of a mixed step one delta-rule op runs, built once per step: the same
    `cu_seqlens` object in every layer lets fla memoize its chunk plan (by tensor identity)."""

    rows: torch.Tensor
    seqs: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    seqs_host: tuple[int, ...]


def _sub_batch(batch: ForwardBatch, seqs: list[int], device: torch.device) -> SubBatch:
    bounds, lens = batch.cu_seqlens_host, batch.query_lens
    rows = [r for i in seqs for r in range(bounds[i], bounds[i + 1])]
    cu = list(itertools.accumulate((lens[i] for i in seqs), initial=0))
    return SubBatch(
        rows=index_tensor(rows, device),
        seqs=index_tensor(seqs, device),
        cu_seqlens=index_tensor(cu, device, torch.int32),
        cu_seqlens_cpu=torch.tensor(cu, dtype=torch.int32),
        seqs_host=tuple(seqs),
    )


def split_by_length(batch: ForwardBatch, device: torch.device) -> tuple[SubBatch, SubBatch]:
    lens = batch.query_lens
    ones = [i for i, n in enumerate(lens) if n == 1]
    many = [i for i, n in enumerate(lens) if n > 1]
    return _sub_batch(batch, ones, device), _sub_batch(batch, many, device)


def mixed_split(batch: ForwardBatch, device: torch.device) -> tuple[SubBatch, SubBatch]:
    return batch.shared(("delta_rule_split", device), lambda: split_by_length(batch, device))


def _slot_range(
    batch: ForwardBatch, states: torch.Tensor
) -> tuple[slice, torch.Tensor | None] | None:
    """(slice, slot order or None) when this step's fp32 slots are one contiguous range."""
    slots = batch.state_indices_host
    if slots is None:
        return None
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
    if order is not None:
        inputs = tuple(x.index_select(0, order) for x in inputs)
    state = cache["recurrent_state"][rows]
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
    """Delta rule over a packed step from each sequence's slot state, final states written
    back: multi-token sequences via `chunk_fn`, single tokens via `recurrent_fn`.
    q, k: [T, H, K]; v: [T, HV, V]; g: [T, HV(, K)]; beta: [T, HV]. Returns o [T, HV, V]."""
    lens = batch.query_lens
    pool = cache["recurrent_state"]
    if batch.attn.has_state is not None:
        state = _masked_rows(pool, batch)
        o, final = chunk_fn(
            q, k, v, g, beta, batch.cu_seqlens, state, use_qk_l2norm=True, inplace_state=True,
            graph_safe=True,
        )  # fmt: skip
        pool.index_copy_(0, batch.state_indices, final.to(pool.dtype))
        return o
    inside = _boundary_buffer(batch, pool)
    if _is_pure_decode(batch):
        if pool.is_cuda:  # fla updates the slots in place, no host sync
            o, _ = recurrent_fn(
                q, k, v, g, beta, batch.cu_seqlens, pool, use_qk_l2norm=True,
                inplace_state=True, state_indices=batch.state_indices,
            )  # fmt: skip
            return o
        in_place = _slot_range(batch, pool)
        if in_place is not None:
            return _decode_in_place(recurrent_fn, (q, k, v, g, beta), cache, batch, *in_place)
    state = read_slots(cache, "recurrent_state", batch)
    if lens and (all(n == 1 for n in lens) or all(n > 1 for n in lens)):
        args = (q, k, v, g, beta, batch.cu_seqlens, state)
        if lens[0] == 1:
            o, final = recurrent_fn(*args, use_qk_l2norm=True, inplace_state=True)
        else:  # host offsets spare the op a device sync
            host = batch.shared("cu_seqlens_cpu", lambda: torch.tensor(batch.cu_seqlens_host))
            extra = _boundary_args(batch, inside, tuple(range(len(lens))), batch.cu_seqlens_host)
            o, final = chunk_fn(
                *args, use_qk_l2norm=True, inplace_state=True, cu_seqlens_cpu=host, **extra
            )
        _write_boundaries(pool, batch, inside)
        pool.index_copy_(0, batch.state_indices, final.to(pool.dtype))
        return o
    final = state.clone()
    o = torch.zeros_like(v)
    for fn, sub in zip((recurrent_fn, chunk_fn), mixed_split(batch, v.device), strict=True):
        if sub.seqs.numel() == 0:
            continue
        rows, idx = sub.rows, sub.seqs
        extra = {"cu_seqlens_cpu": sub.cu_seqlens_cpu} if fn is chunk_fn else {}
        if fn is chunk_fn:
            extra.update(_boundary_args(batch, inside, sub.seqs_host, sub.cu_seqlens_cpu))
        args = (q[rows], k[rows], v[rows], g[rows], beta[rows], sub.cu_seqlens, state[idx])
        o_sub, final_sub = fn(*args, use_qk_l2norm=True, **extra)
        o[rows] = o_sub
        final[idx] = final_sub
    _write_boundaries(pool, batch, inside)
    pool.index_copy_(0, batch.state_indices, final.to(pool.dtype))
    return o


def _boundary_buffer(batch: ForwardBatch, pool: torch.Tensor) -> torch.Tensor | None:
    """[M, HV, K, V] fp32 for the states at `batch.state_boundaries`, or None."""
    if batch.state_boundaries is None:
        return None
    M = sum(len(b) for b in batch.state_boundaries)
    return torch.empty(M, *pool.shape[1:], dtype=torch.float32, device=pool.device)


def _boundary_args(
    batch: ForwardBatch, inside: torch.Tensor | None, seqs: tuple[int, ...], cu_host
) -> dict:
    """The chunk op's boundary arguments for the multi-token sequences `seqs` (batch order:
    only they have boundaries, so all rows of `inside` are theirs)."""
    if inside is None:
        return {}
    plan = batch.shared(("boundary_plan", seqs, inside.device), lambda: plan_rounds(
        cu_host, [batch.state_boundaries[i] for i in seqs], inside.device))  # fmt: skip
    return {"state_boundaries": plan, "boundary_states": inside}


def _write_boundaries(pool: torch.Tensor, batch: ForwardBatch, inside: torch.Tensor | None) -> None:
    if inside is not None:
        pool.index_copy_(0, batch.boundary_rows, inside.to(pool.dtype))
