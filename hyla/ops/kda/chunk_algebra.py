"""Pieces of `cpu.chunk_kda`. Per chunk, with G the cumulative log decay (<= 0), s0 the entering
state: u = Tb (v - (k e^G) s0), Tb = (I + diag(beta) A)^-1 diag(beta); o = (q e^G) s0 + B u; s =
e^{G_last} s0 + (k e^{G_last - G})^T u; A[i, j] = sum_d k_i k_j e^{G_i - G_j} (j < i), B likewise
with q_i (j <= i). `intra_chunk` computes U0 = Tb v and W = Tb k e^G (u = U0 - W s0)."""

from __future__ import annotations

import torch

# Largest decay span e^{-G} (nats) factored within a chunk; stronger chunk-heads go pairwise.
_FACTOR_SPAN = 60.0
# Pairwise-decay elements [z, c, c, K] formed at once on the pairwise path (1 MB fp32).
_PAIR_BUDGET = 1 << 18


class ChunkLayout:
    """Padded chunks ordered step-major: sequences ranked by descending chunk count (`order`), chunk
    j of rank r has id `offsets[j] + r`, so step j updates a prefix of the ranked states. E.g. lens
    5, 2, 9 (c = 4): order [2, 0, 1]; step 0 chunks 0 1 2, step 1 chunks 3 4, step 2 chunk 5."""

    def __init__(self, bounds: list[int], chunk_size: int, device: torch.device) -> None:
        c = self.chunk_size = chunk_size
        N = len(bounds) - 1
        lens = [bounds[i + 1] - bounds[i] for i in range(N)]
        counts = [-(-n // c) for n in lens]
        order = sorted(range(N), key=lambda i: -counts[i])
        rank = [0] * N
        for r, i in enumerate(order):
            rank[i] = r
        self.active = [sum(1 for n in counts if n > j) for j in range(max(counts, default=0))]
        offsets = [0]
        for a in self.active:
            offsets.append(offsets[-1] + a)
        self.offsets, self.num_chunks = offsets, offsets[-1]
        self.order = torch.tensor(order, dtype=torch.long, device=device)
        seq = torch.repeat_interleave(
            torch.arange(N, device=device),
            torch.tensor(lens, device=device),
            output_size=bounds[-1],
        )
        pos = (
            torch.arange(bounds[-1], device=device) - torch.tensor(bounds[:-1], device=device)[seq]
        )
        step_offsets = torch.tensor(offsets[:-1] or [0], dtype=torch.long, device=device)
        ranks = torch.tensor(rank, dtype=torch.long, device=device)
        self.chunk_ids = step_offsets[torch.div(pos, c, rounding_mode="floor")] + ranks[seq]
        self.rows = pos % c

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(self.num_chunks, x.shape[1], self.chunk_size, x.shape[2])
        out.permute(0, 2, 1, 3)[self.chunk_ids, self.rows] = x
        return out

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 1, 3)[self.chunk_ids, self.rows]

    def steps(self):
        for j, active in enumerate(self.active):
            yield slice(self.offsets[j], self.offsets[j + 1]), active


def intra_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """State-free pieces of every chunk. q, k, g: [C, HV, c, K]; v: [C, HV, c, V]; beta: [C, HV, c].
    Returns U0, W, Qg = q e^G, B, Kd = k e^{G_last - G}, e^{G_last}."""
    C, HV, c, K = q.shape
    G = g.cumsum(dim=2)
    eG = G.exp()
    kG, qG = k * eG, q * eG
    A, B = _pair_products(*(x.flatten(0, 1) for x in (q, k, G, kG, qG)))
    last = G[:, :, -1:]
    # (I + diag(beta) A) is unit lower triangular: invert it once, fold beta into its columns
    eye = torch.eye(c, dtype=q.dtype, device=q.device).expand(C * HV, c, c)
    lower = beta.flatten(0, 1).unsqueeze(-1) * A
    inv = torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)
    Tb = (inv * beta.flatten(0, 1).unsqueeze(-2)).view(C, HV, c, c)
    U0, W = (Tb @ torch.cat([v, kG], dim=-1)).split([v.shape[-1], K], dim=-1)
    return U0, W, qG, B.view(C, HV, c, c), k * (last - G).exp(), last.squeeze(2).exp()


def _pair_products(
    q: torch.Tensor, k: torch.Tensor, G: torch.Tensor, kG: torch.Tensor, qG: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Factored as (k_i e^{G_i}) . (k_j e^{-G_j}); e^{-G_j} overflows under strong decay, so
    chunk-heads spanning more than `_FACTOR_SPAN` (e^60 ~ 1e26) take the pairwise form."""
    up = (k * (-G).exp()).transpose(1, 2)
    A, B = kG @ up, qG @ up
    strong = (G[:, -1].amin(dim=-1) < -_FACTOR_SPAN).nonzero().squeeze(1)
    if strong.numel():
        A[strong], B[strong] = _pair_products_pairwise(q[strong], k[strong], G[strong])
    return A.tril_(-1), B.tril_()


def _pair_products_pairwise(
    q: torch.Tensor, k: torch.Tensor, G: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    Z, c, K = q.shape
    A = torch.empty(Z, c, c, dtype=q.dtype, device=q.device)
    B = torch.empty_like(A)
    step = max(1, _PAIR_BUDGET // (c * c * K))
    for z in range(0, Z, step):
        sl = slice(z, z + step)
        Gz = G[sl]
        # j > i would give exp(> 0): clamp to exp(0); those entries are masked by the caller
        pair = (Gz.unsqueeze(2) - Gz.unsqueeze(1)).clamp_max_(0.0)
        pair = pair.exp_().mul_(k[sl].unsqueeze(1))
        kq = torch.stack([k[sl], q[sl]], dim=-1)
        ab = (pair.flatten(0, 1) @ kq.flatten(0, 1)).view(-1, c, c, 2)
        A[sl], B[sl] = ab[..., 0], ab[..., 1]
    return A, B


def inter_chunk(
    s0: torch.Tensor,
    U0: torch.Tensor,
    W: torch.Tensor,
    Qg: torch.Tensor,
    B: torch.Tensor,
    Kd: torch.Tensor,
    decay_last: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    u = U0 - W @ s0
    o = Qg @ s0 + B @ u
    s = decay_last.unsqueeze(-1) * s0 + Kd.transpose(-1, -2) @ u
    return o, s
