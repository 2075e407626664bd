"""KDA vectorized over sequences: the fast path on the CPU, same signatures and results as
`reference.py` (held to it within 1e-5 fp32 by tests/ops/test_kda_cpu.py).

`reference.py` visits one sequence (and one chunk, or one token) at a time; here every sequence
of a call advances together, so a step costs a handful of batched ops whatever N is:

  recurrent_kda  one batched update per token index t (a pure decode step is a single update)
  chunk_kda      all chunks' intra-chunk algebra at once, then one batched state update per
                 chunk index j across the sequences that have a chunk j

Chunks start at each sequence's first token; a sequence's last chunk is padded with
q = k = v = g = beta = 0 rows. Such a row decays nothing (exp(0) = 1), writes nothing (k = 0,
and beta = 0 makes its delta exactly 0) and its output is dropped, so padding never reaches a
state. The math is `reference._chunk_step` with the chunk's cumulative decay G <= 0 measured
from the chunk start, so every exponent is a difference `G_i - G_j` with j <= i or `G_last - G`,
both <= 0: nothing overflows however strong the decay (fp32 throughout, small chunks keep the
triangular solve accurate).
"""

from __future__ import annotations

import torch

from hyla.ops.kda.reference import _initial, check_delta_inputs, prepare_qk

# Largest decay span e^{-G} (nats) factored within a chunk; stronger chunk-heads go pairwise.
_FACTOR_SPAN = 60.0
# Pairwise-decay elements [z, c, c, K] formed at once on the pairwise path (1 MB fp32).
_PAIR_BUDGET = 1 << 18


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.recurrent_kda` with all sequences stepped together (same args and results).

    Per token, with d = exp(g_t): read = [k_t * d, q_t * d]^T S_{t-1} in one matmul, then
    u = beta (v - read_k), S_t = d * S_{t-1} + k u^T and o = read_q + (q . k) u, which is the
    definition's S_t^T q expanded.
    """
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=3)
    T, HV, V = v.shape
    K = q.shape[-1]
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    vf, decay, bf = v.float(), g.float().exp(), beta.float()
    bounds = cu_seqlens.tolist()
    N = len(bounds) - 1
    lens = [bounds[i + 1] - bounds[i] for i in range(N)]
    state = _initial(initial_state, N, HV, K, V, v.device).clone()
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.chunk_kda` with all sequences' chunks batched (same args and results; fp32).

    Raises:
        ValueError: inconsistent shapes, or chunk_size < 1.
    """
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=3)
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    T, HV, V = v.shape
    K = q.shape[-1]
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    bounds = cu_seqlens.tolist()
    N = len(bounds) - 1
    layout = ChunkLayout(bounds, chunk_size, v.device)
    # [T, HV, *] -> [C, HV, c, *] (padded chunks, heads before time)
    qc, kc, vc, gc = (layout.pad(x) for x in (qf, kf, v.float(), g.float()))
    bc = layout.pad(beta.float().unsqueeze(-1)).squeeze(-1)  # [C, HV, c]
    intra = _intra_chunk(qc, kc, vc, gc, bc)
    state = _initial(initial_state, N, HV, K, V, v.device).clone()
    oc = torch.empty(layout.num_chunks, HV, chunk_size, V, dtype=torch.float32, device=v.device)
    for seqs, chunks in layout.steps():
        s = state if seqs is None else state.index_select(0, seqs)
        o_j, s = _inter_chunk(s, *(x.index_select(0, chunks) for x in intra))
        oc.index_copy_(0, chunks, o_j)
        if seqs is None:
            state = s
        else:
            state.index_copy_(0, seqs, s)
    return layout.unpad(oc).to(v.dtype), state


class ChunkLayout:
    """Where each packed token sits among the padded chunks, and which chunks advance together.

        seq lens 5, 2 (c = 4):   chunks  0: s0 t0..t3   1: s0 t4 + 3 pad   2: s1 t0 t1 + 2 pad
        step 0: seqs [0, 1] chunks [0, 2]      step 1: seqs [0] chunks [1]
    """

    def __init__(self, bounds: list[int], chunk_size: int, device: torch.device) -> None:
        self.chunk_size = chunk_size
        lens = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
        counts = [-(-n // chunk_size) for n in lens]
        first = [0]
        for n in counts:
            first.append(first[-1] + n)
        self.num_chunks = first[-1]
        self.num_seqs = len(lens)
        # padded row of each packed token: chunk start * c + position in the sequence
        shift = [first[i] * chunk_size - bounds[i] for i in range(len(lens))]
        self.rows = torch.arange(bounds[-1], device=device) + torch.repeat_interleave(
            torch.tensor(shift, dtype=torch.long, device=device),
            torch.tensor(lens, dtype=torch.long, device=device),
        )
        self._counts, self._first, self._device = counts, first, device

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, HV, D] -> [C, HV, c, D], zeros in the padding rows."""
        c = self.chunk_size
        out = x.new_zeros(self.num_chunks * c, *x.shape[1:])
        out.index_copy_(0, self.rows, x)
        return out.view(self.num_chunks, c, *x.shape[1:]).transpose(1, 2)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """x [C, HV, c, D] -> the packed rows [T, HV, D]."""
        C, HV, c, D = x.shape
        flat = x.transpose(1, 2).reshape(C * c, HV, D)
        return flat.index_select(0, self.rows)

    def steps(self):
        """Per chunk index j: (sequence indices or None for all, chunk ids) as int64 tensors."""
        for j in range(max(self._counts, default=0)):
            seqs = [i for i, n in enumerate(self._counts) if n > j]
            chunks = torch.tensor([self._first[i] + j for i in seqs], device=self._device)
            all_seqs = len(seqs) == self.num_seqs
            yield None if all_seqs else torch.tensor(seqs, device=self._device), chunks


def _intra_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """What each chunk contributes independently of its entering state s0 (see the reference's
    `_chunk_step`): with u = U0 - W s0 the chunk's deltas,

        o = Qg s0 + Bm u,    s = decay_last * s0 + Kd^T u

    q, k, g: [C, HV, c, K]; v: [C, HV, c, V]; beta: [C, HV, c]. Returns (U0 [C, HV, c, V],
    W [C, HV, c, K], Qg [C, HV, c, K], Bm [C, HV, c, c], Kd [C, HV, c, K], decay_last
    [C, HV, K])."""
    C, HV, c, K = q.shape
    G = g.cumsum(dim=2)
    A, Bm = _pair_products(q.flatten(0, 1), k.flatten(0, 1), G.flatten(0, 1))
    A, Bm = A.view(C, HV, c, c), Bm.view(C, HV, c, c)
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    bcol = beta.unsqueeze(-1)  # [C, HV, c, 1]
    rhs = torch.cat([v, k * G.exp()], dim=-1) * bcol
    sol = torch.linalg.solve_triangular(eye + bcol * A, rhs, upper=False)
    U0, W = sol.split([v.shape[-1], K], dim=-1)
    last = G[:, :, -1:]  # [C, HV, 1, K]
    return U0, W, q * G.exp(), Bm, k * (last - G).exp(), last.squeeze(2).exp()


def _pair_products(
    q: torch.Tensor, k: torch.Tensor, G: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A[i, j] = sum_d k_i k_j exp(G_i - G_j) for j < i (else 0) and
    B[i, j] = sum_d q_i k_j exp(G_i - G_j) for j <= i (else 0), per chunk-head.

    Factored as (k_i e^{G_i}) . (k_j e^{-G_j}): two small matmuls. e^{-G_j} grows with the decay
    accumulated since the chunk start, so chunk-heads whose decay spans more than
    `_FACTOR_SPAN` (e^60 ~ 1e26, far from fp32's 3e38) take the pairwise form instead, where
    every exponent is a difference G_i - G_j <= 0 (the reference's).

    q, k, G: [Z, c, K] (G the cumulative log decay from the chunk start). Returns A, B
    [Z, c, c]."""
    up = (k * (-G).exp()).transpose(1, 2)  # [Z, K, c]
    A = (k * G.exp()) @ up
    B = (q * G.exp()) @ up
    strong = (G[:, -1].amin(dim=-1) < -_FACTOR_SPAN).nonzero().squeeze(1)
    if strong.numel():
        A[strong], B[strong] = _pair_products_pairwise(q[strong], k[strong], G[strong])
    return A.tril_(-1), B.tril_()


def _pair_products_pairwise(
    q: torch.Tensor, k: torch.Tensor, G: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_pair_products` with the pairwise decays exp(G_i - G_j) formed explicitly ([z, c, c, K]
    in slices that stay in cache); exact for any decay. Upper triangles are left unmasked."""
    Z, c, K = q.shape
    A = torch.empty(Z, c, c, dtype=q.dtype, device=q.device)
    B = torch.empty_like(A)
    step = max(1, _PAIR_BUDGET // (c * c * K))
    for z in range(0, Z, step):
        sl = slice(z, z + step)
        Gz = G[sl]
        # j > i would give exp(> 0): clamp to exp(0); those entries are masked by the caller
        pair = (Gz.unsqueeze(2) - Gz.unsqueeze(1)).clamp_max_(0.0)
        pair = pair.exp_().mul_(k[sl].unsqueeze(1))  # [z, c(i), c(j), K] = k_j exp(G_i - G_j)
        kq = torch.stack([k[sl], q[sl]], dim=-1)  # [z, c(i), K, 2]
        ab = (pair.flatten(0, 1) @ kq.flatten(0, 1)).view(-1, c, c, 2)  # [z, i, j, 2]
        A[sl], B[sl] = ab[..., 0], ab[..., 1]
    return A, B


def _inter_chunk(
    s0: torch.Tensor,
    U0: torch.Tensor,
    W: torch.Tensor,
    Qg: torch.Tensor,
    Bm: torch.Tensor,
    Kd: torch.Tensor,
    decay_last: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of n sequences from their entering states s0 [n, HV, K, V] (the `_intra_chunk`
    pieces of those chunks). Returns (o [n, HV, c, V], state after the chunk)."""
    u = U0 - W @ s0
    o = Qg @ s0 + Bm @ u
    s = decay_last.unsqueeze(-1) * s0 + Kd.transpose(-1, -2) @ u
    return o, s
