"""Short causal depthwise conv of packed sequences (fla `ShortConvolution`, qwen3_next
`causal_conv1d_fn`); inputs before a sequence's start come from its conv state (oldest first)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

ACTIVATIONS = {"silu": F.silu, "sigmoid": torch.sigmoid}


def check_conv_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor | None,
    activation: str | None,
    cu_seqlens_host: list[int] | None = None,
) -> None:
    T, C = x.shape
    W = weight.shape[-1]
    N = cu_seqlens.numel() - 1
    if weight.shape != (C, W):
        raise ValueError(f"weight: shape {tuple(weight.shape)} != {(C, W)}")
    if conv_state is not None and tuple(conv_state.shape) != (N, C, W - 1):
        raise ValueError(f"conv_state: shape {tuple(conv_state.shape)} != {(N, C, W - 1)}")
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} not in {sorted(ACTIVATIONS)} or None")
    if cu_seqlens_host is not None and len(cu_seqlens_host) != N + 1:
        raise ValueError(f"cu_seqlens_host: {len(cu_seqlens_host)} offsets, expected {N + 1}")
    end = int(cu_seqlens[-1]) if cu_seqlens_host is None else cu_seqlens_host[-1]
    if end != T:
        raise ValueError(f"cu_seqlens: ends at {end}, expected T={T}")


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv of each packed sequence, continuing from its carried inputs.
    x: [T, C]; weight: [C, W]; cu_seqlens: [N + 1]; conv_state: [N, C, W - 1] or None (rows
    without history must be zeros). Returns (y [T, C], new_conv_state [N, C, W - 1])."""
    check_conv_inputs(x, weight, cu_seqlens, conv_state, activation)
    T, C = x.shape
    W = weight.shape[-1]
    N = cu_seqlens.numel() - 1
    state_dtype = x.dtype if conv_state is None else conv_state.dtype
    if conv_state is None:
        conv_state = torch.zeros(N, C, W - 1, dtype=state_dtype, device=x.device)
    wf = weight.float()
    y = torch.empty(T, C, dtype=torch.float32, device=x.device)
    new_state = torch.empty(N, C, W - 1, dtype=state_dtype, device=x.device)
    bounds = cu_seqlens.tolist()
    for i in range(N):
        start, end = bounds[i], bounds[i + 1]
        window = torch.cat([conv_state[i].float().T, x[start:end].float()])
        if end > start:
            taps = window.unfold(0, W, 1)  # [L, C, W]: taps[t] = window[t : t + W].T
            y[start:end] = (taps * wf).sum(-1)
        new_state[i] = window[window.shape[0] - (W - 1) :].T.to(state_dtype)
    if bias is not None:
        y = y + bias.float()
    if activation is not None:
        y = ACTIVATIONS[activation](y)
    return y.to(x.dtype), new_state


def conv_states_at(
    x: torch.Tensor,
    cu_seqlens_host: list[int],
    conv_state: torch.Tensor | None,
    state_boundaries: Sequence[Sequence[int]],
    width: int,
) -> torch.Tensor:
    """Conv state after each b of `state_boundaries[i]` new tokens (prefix-cache checkpoints).
    x: [T, C]; conv_state: [N, C, W - 1] or None. Returns [M, C, W - 1], sequence-major."""
    C, N = x.shape[1], len(cu_seqlens_host) - 1
    dtype = x.dtype if conv_state is None else conv_state.dtype
    rows = []
    for i in range(N):
        start = cu_seqlens_host[i]
        old = x.new_zeros(C, width - 1) if conv_state is None else conv_state[i].to(x.dtype)
        for b in state_boundaries[i]:
            window = torch.cat([old, x[start : start + b].T], dim=1)
            rows.append(window[:, window.shape[1] - (width - 1) :].to(dtype))
    if not rows:
        return x.new_zeros(0, C, width - 1, dtype=dtype)
    return torch.stack(rows)
