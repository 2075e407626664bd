"""Kimi Delta Attention (gated delta rule, one decay per key channel), the readable definition.
Source: Kimi Linear report (arXiv 2510.26692) section 3; transformers' `modeling_kimi_linear.py`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.kda.boundaries import check_boundaries


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dim (fla's l2norm: eps inside the root)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def check_delta_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    g_dims: int,
) -> None:
    T, H, K = q.shape
    HV, V = v.shape[1:]
    if k.shape != q.shape:
        raise ValueError(f"k: shape {tuple(k.shape)} != q shape {tuple(q.shape)}")
    if v.shape[0] != T or HV % H != 0:
        raise ValueError(f"v: shape {tuple(v.shape)} needs T={T} and heads a multiple of H={H}")
    g_shape = (T, HV, K) if g_dims == 3 else (T, HV)
    if tuple(g.shape) != g_shape:
        raise ValueError(f"g: shape {tuple(g.shape)} != {g_shape}")
    if tuple(beta.shape) != (T, HV):
        raise ValueError(f"beta: shape {tuple(beta.shape)} != {(T, HV)}")
    if cu_seqlens.dim() != 1 or int(cu_seqlens[-1]) != T or int(cu_seqlens[0]) != 0:
        raise ValueError(f"cu_seqlens: must run from 0 to T={T}, got {cu_seqlens.tolist()}")
    N = cu_seqlens.numel() - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, HV, K, V):
        raise ValueError(f"initial_state: shape {tuple(initial_state.shape)} != {(N, HV, K, V)}")


def prepare_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float | None, use_qk_l2norm: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 q, k repeated to `num_v_heads` (value head j reads key head j // (HV // H)), optionally
    L2-normalized, q times `scale` (default K^-0.5). Returns [T, HV, K] each."""
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    group = num_v_heads // q.shape[1]
    if group > 1:
        q = q.repeat_interleave(group, dim=1)
        k = k.repeat_interleave(group, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return q * scale, k


def _initial(
    initial_state: torch.Tensor | None, n: int, HV: int, K: int, V: int, device: torch.device
) -> torch.Tensor:
    if initial_state is None:
        return torch.zeros(n, HV, K, V, dtype=torch.float32, device=device)
    return initial_state.float()


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
    """KDA token by token in fp32. q, k: [T, H, K]; v: [T, HV, V] (HV a multiple of H); g:
    [T, HV, K] log decay (<= 0); beta: [T, HV]; initial_state: [N, HV, K, V] or None."""
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=3)
    T, HV, V = v.shape
    K = q.shape[-1]
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    vf, decay, bf = v.float(), g.float().exp(), beta.float()
    bounds = cu_seqlens.tolist()
    state = _initial(initial_state, len(bounds) - 1, HV, K, V, v.device).clone()
    o = torch.zeros(T, HV, V, dtype=torch.float32, device=v.device)
    for i in range(len(bounds) - 1):
        s = state[i]
        for t in range(bounds[i], bounds[i + 1]):
            s = s * decay[t].unsqueeze(-1)
            predicted = torch.einsum("hkv,hk->hv", s, kf[t])
            u = bf[t].unsqueeze(-1) * (vf[t] - predicted)
            s = s + kf[t].unsqueeze(-1) * u.unsqueeze(-2)
            o[t] = torch.einsum("hkv,hk->hv", s, qf[t])
        state[i] = s
    return o.to(v.dtype), state


def _chunk_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s0: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairwise decays are differences before exp, so no factor overflows."""
    c = q.shape[1]
    G = g.cumsum(dim=1)
    diff = G.unsqueeze(2) - G.unsqueeze(1)
    upper = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)
    pair_decay = diff.masked_fill(upper[..., None], float("-inf")).exp()
    A = torch.einsum("hid,hjd,hijd->hij", k, k, pair_decay).tril(-1)
    B = torch.einsum("hid,hjd,hijd->hij", q, k, pair_decay)
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    rhs = beta.unsqueeze(-1) * (v - (k * G.exp()) @ s0)
    u = torch.linalg.solve_triangular(eye + beta.unsqueeze(-1) * A, rhs, upper=False)
    o = (q * G.exp()) @ s0 + B @ u
    last = G[:, -1:, :]
    s = last.transpose(1, 2).exp() * s0 + (k * (last - G).exp()).transpose(1, 2) @ u
    return o, s


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
    state_boundaries: Sequence[Sequence[int]] | None = None,
    boundary_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA in chunks (WY/UT form, Yang et al. 2024), also restarting at `state_boundaries`, whose
    states go to `boundary_states: [M, HV, K, V]`. float64: fp32's triangular solve loses bits
    that the layers' gated output norm amplifies."""
    check_delta_inputs(q, k, v, g, beta, cu_seqlens, initial_state, g_dims=3)
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    T, HV, V = v.shape
    K = q.shape[-1]
    qf, kf = prepare_qk(q, k, HV, scale, use_qk_l2norm)
    qf, kf, vf, gf = (x.transpose(0, 1).double() for x in (qf, kf, v.float(), g.float()))
    bf = beta.float().transpose(0, 1).double()
    bounds = cu_seqlens.tolist()
    N = len(bounds) - 1
    marks = [[]] * N if state_boundaries is None else state_boundaries
    lens = [bounds[i + 1] - bounds[i] for i in range(N)]
    if state_boundaries is not None:
        check_boundaries(state_boundaries, lens, boundary_states, (HV, K, V))
    state = _initial(initial_state, N, HV, K, V, v.device).double()
    o = torch.zeros(HV, T, V, dtype=torch.float64, device=v.device)
    m = 0
    for i in range(N):
        s = state[i]
        for lo, hi in zip([0, *marks[i]], [*marks[i], lens[i]], strict=True):
            for start in range(bounds[i] + lo, bounds[i] + hi, chunk_size):
                rows = slice(start, min(start + chunk_size, bounds[i] + hi))
                o[:, rows], s = _chunk_step(
                    qf[:, rows], kf[:, rows], vf[:, rows], gf[:, rows], bf[:, rows], s
                )
            if hi < lens[i]:
                boundary_states[m] = s.float()
                m += 1
        state[i] = s
    return o.transpose(0, 1).to(v.dtype), state.float()
