"""Vectorized `reference.causal_conv1d`: a shifted slice of x per tap, then the first W-1 tokens
of each sequence redone from state_i ++ x_i. Every path sums taps in the same order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.short_conv.reference import ACTIVATIONS, check_conv_inputs


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor | None = None,
    activation: str | None = "silu",
    *,
    cu_seqlens_host: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.causal_conv1d` vectorized; cu_seqlens_host, when given, spares a readback."""
    check_conv_inputs(x, weight, cu_seqlens, conv_state, activation, cu_seqlens_host)
    T, C = x.shape
    W = weight.shape[-1]
    N = cu_seqlens.numel() - 1
    state_dtype = x.dtype if conv_state is None else conv_state.dtype
    if conv_state is None:
        conv_state = torch.zeros(N, C, W - 1, dtype=state_dtype, device=x.device)
    bounds = cu_seqlens.tolist() if cu_seqlens_host is None else list(cu_seqlens_host)
    if T == N and N > 0 and bounds == list(range(N + 1)):
        y, new_state = _one_token_each(x, weight.float(), conv_state)
    else:
        y, new_state = _packed(x, weight.float(), bounds, conv_state)
    if bias is not None:
        y = y + bias.float()
    if activation is not None:
        y = ACTIVATIONS[activation](y)
    return y.to(x.dtype), new_state.to(state_dtype)


def _one_token_each(
    x: torch.Tensor, wf: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    state = conv_state.float()
    taps = [state[..., j] for j in range(wf.shape[-1] - 1)] + [x.float()]
    return _tap_sum(taps, wf), torch.cat([state[..., 1:], taps[-1].unsqueeze(-1)], dim=-1)


def _tap_sum(taps: list[torch.Tensor], wf: torch.Tensor) -> torch.Tensor:
    y = taps[-1] * wf[:, -1]
    for j in range(len(taps) - 1):
        y.addcmul_(taps[j], wf[:, j])
    return y


def _packed(
    x: torch.Tensor, wf: torch.Tensor, bounds: list[int], conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    T, C = x.shape
    N, W = conv_state.shape[0], wf.shape[-1]
    xf = x.float()
    y = xf * wf[:, -1]
    for j in range(W - 1):
        shift = W - 1 - j
        if shift < T:
            y[shift:].addcmul_(xf[: T - shift], wf[:, j])
    # rows [0, N*(W-1)): the states (oldest first), then the packed tokens
    source = torch.cat([conv_state.float().transpose(1, 2).reshape(-1, C), xf])
    lens = [bounds[i + 1] - bounds[i] for i in range(N)]
    head = [(i, p) for i in range(N) for p in range(min(W - 1, lens[i]))]
    if head:
        rows = torch.tensor([bounds[i] + p for i, p in head], device=x.device)
        taps = [_window_rows(head, j, bounds, N, W, x.device) for j in range(W)]
        y[rows] = _tap_sum([source.index_select(0, t) for t in taps], wf)
    tail = [(i, lens[i] + e) for i in range(N) for e in range(W - 1)]
    new_state = source.index_select(0, _window_rows(tail, 0, bounds, N, W, x.device))
    return y, new_state.view(N, W - 1, C).transpose(1, 2).contiguous()


def _window_rows(
    positions: list[tuple[int, int]], tap: int, bounds: list[int], N: int, W: int, device
) -> torch.Tensor:
    rows = []
    for i, e in positions:
        e += tap
        rows.append(i * (W - 1) + e if e < W - 1 else N * (W - 1) + bounds[i] + e - (W - 1))
    return torch.tensor(rows, dtype=torch.long, device=device)


def conv_boundary_rows(
    cu_seqlens_host: list[int], state_boundaries: Sequence[Sequence[int]], width: int
) -> list[int]:
    """Rows of [N*(W-1) state rows ; T tokens] making the conv state after each b of
    `state_boundaries[i]` new tokens of sequence i, sequence-major: M*(W-1) ints."""
    N, W = len(cu_seqlens_host) - 1, width
    bounds = list(cu_seqlens_host)
    return [
        i * (W - 1) + e if e < W - 1 else N * (W - 1) + bounds[i] + e - (W - 1)
        for i in range(N)
        for b in state_boundaries[i]
        for e in range(b, b + W - 1)
    ]


def conv_states_gather(
    x: torch.Tensor, conv_state: torch.Tensor, rows: torch.Tensor, width: int
) -> torch.Tensor:
    """`reference.conv_states_at` as one gather. x: [T, C], conv_state: [N, C, W-1],
    rows: [M*(W-1)] from `conv_boundary_rows`. Returns [M, C, W-1] in conv_state's dtype."""
    C, W, N = x.shape[1], width, conv_state.shape[0]
    M = rows.numel() // (W - 1) if W > 1 else 0
    if M == 0:
        return x.new_zeros(0, C, W - 1, dtype=conv_state.dtype)
    head = conv_state.to(x.dtype).transpose(1, 2).reshape(N * (W - 1), C)
    picked = torch.cat([head, x]).index_select(0, rows)
    return picked.view(M, W - 1, C).transpose(1, 2).to(conv_state.dtype).contiguous()
