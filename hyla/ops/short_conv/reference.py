"""Short causal depthwise convolution over packed varlen sequences, with a carried state.

Source: the `ShortConvolution` of flash-linear-attention and `causal_conv1d_fn` /
`causal_conv1d_update` in transformers' `models/qwen3_next/modeling_qwen3_next.py` (an
`nn.Conv1d` with `groups=C`, left padding W - 1, weight [C, 1, W]). Each channel c of token t
mixes the W most recent inputs of its own sequence:

    y[t, c] = act(bias[c] + sum_{j<W} weight[c, j] * x[t - (W - 1) + j, c])

Inputs before a sequence's first new token come from its conv state: the last W - 1 inputs of
the previous chunk, oldest first (zeros for a fresh sequence):

    conv_state[i] = | x[-3] x[-2] x[-1] |   (W = 4)     window of token 0 = state + x[0]
    new state     = last W - 1 of (old state ++ new tokens)

so a chunk shorter than W - 1 leaves part of the old state in the new one.
"""

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
    """Raise ValueError unless the arguments of a `causal_conv1d` call agree (the offsets'
    end is read from `cu_seqlens_host` when given, else from the tensor)."""
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

    Args:
        x: [T, C] new inputs of N packed sequences (any float dtype).
        weight: [C, W] taps, the last one multiplying the current token (HF Conv1d
            `weight.squeeze(1)`).
        bias: [C] or None.
        cu_seqlens: [N + 1] int32 offsets of the sequences in x.
        conv_state: [N, C, W - 1] the previous W - 1 inputs of each sequence, oldest first, or
            None for zeros. Rows of sequences without history must be zeros (the caller clears
            them; garbage here is read).
        activation: "silu", "sigmoid" or None.
    Returns:
        y: [T, C] in x's dtype (computed in fp32).
        new_conv_state: [N, C, W - 1] the last W - 1 inputs of each sequence (old state
            included when the sequence has fewer than W - 1 new tokens), in conv_state's dtype
            (x's dtype when conv_state is None).
    Raises:
        ValueError: inconsistent shapes or an unknown activation.
    """
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
        window = torch.cat([conv_state[i].float().T, x[start:end].float()])  # [W-1+L, C]
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
    """The conv state each sequence would carry after exactly b of its new tokens, for every b
    in `state_boundaries[i]` (prefix-cache checkpoints inside a chunk): the last W - 1 inputs of
    (old state ++ x[:b]), as `causal_conv1d` would return after a chunk ending there.

    Args:
        x: [T, C] the call's inputs; cu_seqlens_host: N + 1 host offsets; conv_state:
            [N, C, W - 1] or None for zeros; width: W.
    Returns: [M, C, W - 1] in conv_state's dtype (x's when None), sequence-major.
    """
    C, N = x.shape[1], len(cu_seqlens_host) - 1
    dtype = x.dtype if conv_state is None else conv_state.dtype
    rows = []
    for i in range(N):
        start = cu_seqlens_host[i]
        old = x.new_zeros(C, width - 1) if conv_state is None else conv_state[i].to(x.dtype)
        for b in state_boundaries[i]:
            window = torch.cat([old, x[start : start + b].T], dim=1)  # [C, W - 1 + b]
            rows.append(window[:, window.shape[1] - (width - 1) :].to(dtype))
    if not rows:
        return x.new_zeros(0, C, width - 1, dtype=dtype)
    return torch.stack(rows)
