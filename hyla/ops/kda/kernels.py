"""KDA on CUDA through fla-core (>= 0.6.0, lazily imported): the recurrent kernel is fp32; the
chunk kernels use tl.dot (TF32 for fp32) and input-dtype intermediates, with an fp32 final state."""

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
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
        import fla.ops.kda  # noqa: F401
    except Exception:  # ImportError, or triton failing to initialise without a GPU
        return False
    return True


def dispatch(cpu_fn: DeltaRuleOp, fla_fn: DeltaRuleOp) -> DeltaRuleOp:
    """`fla_fn` for CUDA q when fla imports, else `cpu_fn` (`state_indices` by gather/scatter)."""

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
    states = initial_state.index_select(0, state_indices)
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
    """`reference.check_delta_inputs` without reading cu_seqlens; `initial_state` may be a pool."""
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
    if x.device.index is None or x.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(x.device)


def fla_rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().unsqueeze(0)


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
    """fla's fused recurrent KDA on checked inputs; shared with GDN."""
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
            inplace_final_state=h0 is not None,
            cu_seqlens=cu_seqlens,
            ssm_state_indices=state_indices,
            use_qk_l2norm_in_kernel=use_qk_l2norm,
            out=torch.empty_like(v1),  # every row is written: no memset
        )
    if h0 is not initial_state and not pooled:
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
    """KDA token by token, as `reference.recurrent_kda`, never reading cu_seqlens on the host.
    `inplace_state`: a float32 `initial_state` is updated in place and returned. `state_indices`
    [N]: sequence i starts from row `state_indices[i]` of the pool `initial_state`; with
    `inplace_state` the final states go back there (in fla's kernel for a float32 decode step).
    Unchecked (it would sync): there T == N must mean one token per sequence, as fla reads token
    j of sequence i's slot at `state_indices[i + j]`."""
    check_step_shapes(q, k, v, g, beta, cu_seqlens, initial_state, state_indices, g_dims=3)
    return fused_recurrent(
        q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm, inplace_state,
        state_indices,
    )  # fmt: skip


class _VarlenOffsets:
    """The step's `cu_seqlens` as fla wants it (int64 device + host copy), cached for the last
    object seen so fla's identity-memoized chunk plan is built once per step, not per layer."""

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
    """Validate on the host copy of cu_seqlens; returns (int64 cu_seqlens, host copy)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    cu_long, cu_host = varlen_offsets(cu_seqlens, cu_seqlens_cpu)
    check_delta_inputs(q, k, v, g, beta, cu_host, initial_state, g_dims)
    return cu_long, cu_host


def final_state(
    initial_state: torch.Tensor | None, final: torch.Tensor, inplace_state: bool
) -> torch.Tensor:
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
    """One fla chunked delta-rule call on hyla's packed inputs."""
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
    """KDA in chunks, as `reference.chunk_kda`; fla supports chunk_size 32 and 64 (others run
    with 64). cu_seqlens_cpu: the offsets on the CPU, else fla's planning reads them back (a sync
    per step). graph_safe: fla plans a fixed grid on the device (CUDA graphs; not with
    state_boundaries)."""
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
