"""KDA on CUDA through fla-core's Triton kernels (flash-linear-attention >= 0.6.0).

Same signatures, layouts and results as `cpu.py` / `reference.py` (within the bounds of
tests/gpu/test_linear_attention_gpu.py); fla is imported inside the functions, so importing this
module never needs fla or triton. hyla -> fla:

    q, k [T, H, K], v [T, HV, V] packed rows   ->  [1, T, ...] with cu_seqlens (fla's varlen)
    g [T, HV, K] log-decay per key channel     ->  g as is (fla's default, use_gate_in_kernel=False,
                                                   also multiplies the state by exp(g))
    HV > H (GVA)                               ->  native in fla: value head j reads key head
                                                   j // (HV // H), as `reference.prepare_qk`
    use_qk_l2norm                              ->  use_qk_l2norm_in_kernel (eps 1e-6 in the root,
                                                   like `reference.l2_normalize`)
    states [N, HV, K, V] float32               ->  same layout (state_v_first=False)

`recurrent_kda` calls `fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd`, the entry under
the public `fused_recurrent_kda` that can write the final state over the initial one
(`inplace_final_state`) and read/write a state pool through `ssm_state_indices` (vLLM's
continuous batching): a decode step then touches each state exactly once (read + write), with
no gather and no scatter. `chunk_kda` calls `fla.ops.kda.chunk_kda`, whose final state is a new
tensor (copied back for `inplace_state`; a prefill is compute-bound, the copy is noise).

Precision: the recurrent kernel is fp32 FMAs throughout (matches the reference to fp32
rounding, then the output is rounded to v's dtype). The chunk kernels run their matmuls with
`tl.dot` (TF32 for fp32 inputs) and keep intermediate matrices and per-chunk states in the
input dtype (bf16 for bf16 inputs); the final state is accumulated in fp32.

The recurrent path never reads `cu_seqlens` on the host (no device sync on decode); the chunk
path copies it to the host once (fla needs it there to plan its chunks) and validates it.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Sequence

import torch

from hyla.ops.kda.boundaries import split_at_boundaries
from hyla.ops.kda.reference import check_delta_inputs

DeltaRuleOp = Callable[..., tuple[torch.Tensor, torch.Tensor]]
FLA_KDA_CHUNK_SIZES = (32, 64)


@functools.cache
def fla_available() -> bool:
    """True when fla-core's KDA and gated-delta-rule ops import (checked once per process)."""
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
        import fla.ops.kda  # noqa: F401
    except Exception:  # ImportError, or triton failing to initialise without a GPU
        return False
    return True


def dispatch(cpu_fn: DeltaRuleOp, fla_fn: DeltaRuleOp) -> DeltaRuleOp:
    """The public op: `fla_fn` when q is a CUDA tensor and fla imports, else `cpu_fn` (pure
    PyTorch, any device). On the `cpu_fn` path a `state_indices` keyword is served by gathering
    the slots, running `cpu_fn` and scattering the final states back (see `recurrent_kda`)."""

    @functools.wraps(fla_fn)
    def op(q: torch.Tensor, *args, **options) -> tuple[torch.Tensor, torch.Tensor]:
        if q.is_cuda and fla_available():
            return fla_fn(q, *args, **options)
        options.pop("graph_safe", None)  # the CPU ops may read cu_seqlens on the host
        if options.get("state_indices") is None:
            options.pop("state_indices", None)
            return cpu_fn(q, *args, **options)
        return _on_gathered_slots(cpu_fn, q, *args, **options)

    return op


def _on_gathered_slots(
    fn: DeltaRuleOp,
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
    state_indices: torch.Tensor,
    inplace_state: bool = False,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    if initial_state is None:
        raise ValueError("state_indices: needs initial_state, the state pool [S, HV, K, V]")
    states = initial_state.index_select(0, state_indices)  # [N, HV, K, V]
    o, final = fn(
        q, k, v, g, beta, cu_seqlens, states, scale, use_qk_l2norm, inplace_state=True, **options
    )
    if not inplace_state:
        return o, final
    initial_state.index_copy_(0, state_indices, final.to(initial_state.dtype))
    return o, initial_state


def check_step_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    state_indices: torch.Tensor | None,
    g_dims: int,
) -> None:
    """`reference.check_delta_inputs` without reading cu_seqlens' values (no device sync);
    with `state_indices` [N], `initial_state` is a pool [S, HV, K, V]. Raises ValueError."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    N = cu_seqlens.numel() - 1
    if k.shape != q.shape or v.shape[0] != T or HV % H != 0:
        raise ValueError(f"q, k, v: shapes {[tuple(x.shape) for x in (q, k, v)]} do not agree")
    if tuple(g.shape) != ((T, HV, K) if g_dims == 3 else (T, HV)) or tuple(beta.shape) != (T, HV):
        raise ValueError(f"g, beta: shapes {tuple(g.shape)}, {tuple(beta.shape)} for T={T}")
    if cu_seqlens.dim() != 1 or N < 0:
        raise ValueError(f"cu_seqlens: must be [N + 1], got shape {tuple(cu_seqlens.shape)}")
    if state_indices is not None:
        if initial_state is None or tuple(initial_state.shape[1:]) != (HV, K, V):
            raise ValueError(f"state_indices: needs a state pool [S, {HV}, {K}, {V}]")
        if tuple(state_indices.shape) != (N,):
            raise ValueError(f"state_indices: shape {tuple(state_indices.shape)} != {(N,)}")
    elif initial_state is not None and tuple(initial_state.shape) != (N, HV, K, V):
        raise ValueError(f"initial_state: shape {tuple(initial_state.shape)} != {(N, HV, K, V)}")


def on_device(x: torch.Tensor) -> contextlib.AbstractContextManager:
    # fla's Triton launches go to the current CUDA device; only switch when it differs
    if x.device.index is None or x.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(x.device)


def fla_rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().unsqueeze(0)  # [T, ...] -> [1, T, ...], fla's varlen layout


def _owns_rows(state: torch.Tensor | None) -> bool:
    """A float32 state whose rows [HV, K, V] are contiguous: fla can write it in place."""
    return (
        state is not None
        and state.dtype == torch.float32
        and state[:1].is_contiguous()
        and state.stride(0) >= state[0].numel()
    )


def fused_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    scale: float | None,
    use_qk_l2norm: bool,
    inplace_state: bool,
    state_indices: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's fused recurrent KDA kernel on checked hyla inputs (g per key channel [T, HV, K]);
    shared by `recurrent_kda` and GDN's recurrent op."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    N = cu_seqlens.numel() - 1
    pooled = state_indices is not None
    if pooled and not (inplace_state and q.shape[0] == N and _owns_rows(initial_state)):
        # the kernel addresses a pool only for one token per sequence, written in place
        return _on_gathered_slots(
            recurrent_kda, q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm,
            state_indices=state_indices, inplace_state=inplace_state,
        )  # fmt: skip
    h0 = initial_state
    if h0 is not None and not (pooled or (inplace_state and _owns_rows(h0) and h0.is_contiguous())):
        h0 = h0.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    v1 = fla_rows(v)
    with on_device(v):
        o, final = fused_recurrent_kda_fwd(
            q=fla_rows(q),
            k=fla_rows(k),
            v=v1,
            g=fla_rows(g),
            beta=fla_rows(beta),
            scale=scale,
            initial_state=h0,
            output_final_state=h0 is None,
            inplace_final_state=h0 is not None,  # into h0: the caller's state or our copy
            cu_seqlens=cu_seqlens,
            ssm_state_indices=state_indices,
            use_qk_l2norm_in_kernel=use_qk_l2norm,
            out=torch.empty_like(v1),  # every row is written: no memset
        )
    if h0 is not initial_state and not pooled:  # fla wrote our copy: honour inplace_state
        final = final_state(initial_state, final, inplace_state)
    return o[0], final


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
    state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA token by token (`reference.recurrent_kda`: same math, arguments and results).

    Args:
        q, k: [T, H, K] queries and keys (packed varlen rows).
        v: [T, HV, V] values; HV is a multiple of H (GVA).
        g: [T, HV, K] log-space decay per key channel (<= 0).
        beta: [T, HV] write strength of each token.
        cu_seqlens: [N + 1] int32 (or int64) offsets of the packed sequences (values are not
            checked here: reading them would sync the device).
        initial_state: [N, HV, K, V] state before each sequence, or None for zeros; with
            `state_indices`, the state pool [S, HV, K, V] instead.
        scale: query scale, default K^-0.5.
        use_qk_l2norm: L2-normalize q and k per head first.
        inplace_state: a float32 `initial_state` is updated in place and returned as the final
            state (fla writes it directly when its rows are contiguous, else it is copied back).
        state_indices: [N] int slot of each sequence in the pool `initial_state` (optional,
            hyla extension): sequence i starts from `initial_state[state_indices[i]]`. With
            `inplace_state`, the final states are written back to those slots and the pool is
            returned as final_state; a decode step (T == N) on a float32 pool does this inside
            fla's kernel (`ssm_state_indices`) without gathering or scattering. Without
            `inplace_state` the pool is untouched and final_state is [N, HV, K, V].
            Precondition of that in-kernel path (not checked: it would sync the device): T == N
            means one token per sequence. fla addresses the slot of token j of sequence i as
            `state_indices[i + j]`, so cu_seqlens with an empty sequence and a 2-token one
            (T == N, e.g. [0, 0, 2]) writes another sequence's slot or reads past
            `state_indices`.
    Returns:
        o: [T, HV, V] in v's dtype; final_state: [N, HV, K, V] float32 (or the pool, above).
    Raises:
        ValueError: inconsistent shapes.
    """
    check_step_shapes(q, k, v, g, beta, cu_seqlens, initial_state, state_indices, g_dims=3)
    return fused_recurrent(
        q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm, inplace_state,
        state_indices,
    )  # fmt: skip


class _VarlenOffsets:
    """One step's `cu_seqlens` as fla wants it: an int64 device tensor and an int64 host copy,
    remembered for the last `cu_seqlens` object seen. Every linear layer of a step passes the
    same `batch.cu_seqlens`, so they all hand fla the same two tensors, and fla's chunk plan
    (memoized by tensor identity, `fla.utils.tensor_cache`) is computed once per step instead of
    once per layer. The host copy costs one device sync per step unless the caller passes it
    (`host`, a CPU tensor of the same offsets)."""

    def __init__(self) -> None:
        self._key: weakref.ref | None = None
        self._value: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(
        self, cu_seqlens: torch.Tensor, host: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if host is not None and host.device.type != "cpu":
            raise ValueError(f"cu_seqlens_cpu: must be a CPU tensor, got {host.device}")
        if self._key is not None and self._key() is cu_seqlens and self._value is not None:
            return self._value
        host = cu_seqlens.to("cpu", torch.int64) if host is None else host.long()
        value = (cu_seqlens.long(), host)
        self._key, self._value = weakref.ref(cu_seqlens), value
        return value


varlen_offsets = _VarlenOffsets()


def host_offsets(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    g_dims: int,
    chunk_size: int,
    cu_seqlens_cpu: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a chunked call (`reference.check_delta_inputs`) on the host copy of cu_seqlens
    (`cu_seqlens_cpu` when given, else read back); returns (cu_seqlens int64 on the device, the
    host copy), both from `varlen_offsets`."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    cu_long, cu_host = varlen_offsets(cu_seqlens, cu_seqlens_cpu)
    check_delta_inputs(q, k, v, g, beta, cu_host, initial_state, g_dims)
    return cu_long, cu_host


def final_state(
    initial_state: torch.Tensor | None, final: torch.Tensor, inplace_state: bool
) -> torch.Tensor:
    """fla's new final state, or the caller's float32 `initial_state` overwritten with it."""
    if inplace_state and initial_state is not None and initial_state.dtype == torch.float32:
        return initial_state.copy_(final)
    return final


def run_fla_chunk(
    fla_fn: DeltaRuleOp,
    inputs: tuple,
    g_dims: int,
    scale: float | None,
    use_qk_l2norm: bool,
    chunk_size: int,
    fla_chunk_size: int,
    inplace_state: bool,
    cu_seqlens_cpu: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One fla chunked delta-rule call (`chunk_kda` or `chunk_gated_delta_rule`) on hyla's packed
    inputs (q, k, v, g, beta, cu_seqlens, initial_state): validates them, reshapes to fla's
    [1, T, ...] varlen layout and returns (o in v's dtype, final state; see `final_state`)."""
    q, k, v, g, beta, cu_seqlens, initial_state = inputs
    cu_long, cu_host = host_offsets(
        q, k, v, g, beta, cu_seqlens, initial_state, g_dims, chunk_size, cu_seqlens_cpu
    )
    h0 = None if initial_state is None else initial_state.float().contiguous()
    with on_device(v):
        o, final = fla_fn(
            *(fla_rows(x) for x in (q, k, v, g, beta)),
            scale=scale,
            initial_state=h0,
            output_final_state=True,
            use_qk_l2norm_in_kernel=use_qk_l2norm,
            cu_seqlens=cu_long,
            cu_seqlens_cpu=cu_host,
            chunk_size=fla_chunk_size,
        )
    return o[0].to(v.dtype), final_state(initial_state, final, inplace_state)


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
    chunk_size: int = 64,
    inplace_state: bool = False,
    cu_seqlens_cpu: torch.Tensor | None = None,
    state_boundaries: Sequence[Sequence[int]] | None = None,
    boundary_states: torch.Tensor | None = None,
    graph_safe: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA in chunks (`reference.chunk_kda`: same arguments and results up to the precision
    noted in the module docstring). Shapes as in `recurrent_kda` (initial_state [N, HV, K, V]).

    Args:
        chunk_size: a tiling choice that does not change the result; fla supports 32 and 64,
            any other value runs with 64.
        inplace_state: a float32 `initial_state` is overwritten with the final state and
            returned (fla computes it out of place; it is copied back).
        cu_seqlens_cpu: the same offsets as a CPU tensor, when the caller has them (the engine
            does: `ForwardBatch.cu_seqlens_host`): fla plans its chunks on the host, and without
            them cu_seqlens is copied back, a device sync per step that stops the host from
            queueing kernels ahead of the GPU. Not checked against cu_seqlens (that would sync).
        state_boundaries, boundary_states: states inside each sequence, as in
            `reference.chunk_kda`: the call is split into rounds of fla calls at the boundaries
            (`boundaries.split_at_boundaries`).
        graph_safe: no host read of cu_seqlens (a CUDA-graph capture): fla plans a fixed grid
            of ceil(T / 64) + N - 1 chunks on the device (`use_graph`), zero-length sequences
            allowed; not with state_boundaries.
    Raises:
        ValueError: inconsistent shapes or cu_seqlens, chunk_size < 1, or a `cu_seqlens_cpu`
            that is not a CPU tensor.
    """
    from fla.ops.kda import chunk_kda as fla_chunk_kda

    if state_boundaries is not None and any(state_boundaries):
        return split_at_boundaries(
            chunk_kda, q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm,
            state_boundaries=state_boundaries, boundary_states=boundary_states,
            inplace_state=inplace_state, cu_seqlens_cpu=cu_seqlens_cpu, chunk_size=chunk_size,
            recurrent_fn=recurrent_kda,
        )  # fmt: skip
    if graph_safe:
        return _chunk_kda_fixed_grid(q, k, v, g, beta, cu_seqlens, initial_state, scale,
                                     use_qk_l2norm, inplace_state)  # fmt: skip
    inputs = (q, k, v, g, beta, cu_seqlens, initial_state)
    fla_chunk_size = chunk_size if chunk_size in FLA_KDA_CHUNK_SIZES else 64
    return run_fla_chunk(fla_chunk_kda, inputs, 3, scale, use_qk_l2norm, chunk_size,
                         fla_chunk_size, inplace_state, cu_seqlens_cpu)  # fmt: skip


def _chunk_kda_fixed_grid(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    scale: float | None,
    use_qk_l2norm: bool,
    inplace_state: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's chunk KDA with its chunk plan built on the device for a fixed grid (capturable)."""
    from fla.ops.kda import chunk_kda as fla_chunk_kda

    check_step_shapes(q, k, v, g, beta, cu_seqlens, initial_state, None, g_dims=3)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    with on_device(v):
        o, final = fla_chunk_kda(
            *(fla_rows(x) for x in (q, k, v, g, beta)),
            scale=scale,
            initial_state=h0,
            output_final_state=True,
            use_qk_l2norm_in_kernel=use_qk_l2norm,
            cu_seqlens=cu_seqlens.long(),
            use_graph=True,
            max_num_seqs=cu_seqlens.numel() - 1,
        )
    return o[0].to(v.dtype), final_state(initial_state, final, inplace_state)
