"""Short causal conv with every sequence at once: the fast path of `reference.causal_conv1d`
(same signature and results; tests/ops/test_short_conv.py holds them together).

Tap j of token t reads x[t - (W-1) + j]. Over the packed rows that is one shifted slice of x
per tap, right for every token at least W-1 positions into its sequence; the first W-1 tokens
of each sequence read (part of) the carried state instead, and are recomputed from a small
table of their windows:

    packed x:   | s0: x0 x1 x2 x3 x4 | s1: x0 x1 ... |       W = 3: rows s0.x0, s0.x1, s1.x0,
    windows:    state_i (W-1 rows, oldest first) ++ x_i   s1.x1 are fixed up from state ++ x

Every token's sum runs in the same order (the current token's tap, then the older ones oldest
first) on every path, decode included; only the vector width of the elementwise kernels, which
follows the tensor's size, can round a last bit differently.
"""

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
    """`reference.causal_conv1d` vectorized over sequences; see it for arguments and results.

    Args:
        x: [T, C]; weight: [C, W]; bias: [C] or None; cu_seqlens: [N + 1] int32;
        conv_state: [N, C, W - 1] or None for zeros; activation: "silu", "sigmoid" or None.
        cu_seqlens_host: the same offsets as host ints, when the caller has them: then
            cu_seqlens is never read back (a device sync per call on a GPU).
    Returns: y [T, C] in x's dtype (fp32 compute); new_conv_state [N, C, W - 1].
    Raises: ValueError: inconsistent shapes or an unknown activation.
    """
    check_conv_inputs(x, weight, cu_seqlens, conv_state, activation, cu_seqlens_host)
    T, C = x.shape
    W = weight.shape[-1]
    N = cu_seqlens.numel() - 1
    state_dtype = x.dtype if conv_state is None else conv_state.dtype
    if conv_state is None:
        conv_state = torch.zeros(N, C, W - 1, dtype=state_dtype, device=x.device)
    bounds = cu_seqlens.tolist() if cu_seqlens_host is None else list(cu_seqlens_host)
    if T == N and N > 0 and bounds == list(range(N + 1)):  # one token per sequence
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
    """Decode: sequence i's window is its state then x[i]. Returns (y [N, C] fp32 before bias
    and activation, new state [N, C, W-1])."""
    state = conv_state.float()
    taps = [state[..., j] for j in range(wf.shape[-1] - 1)] + [x.float()]  # oldest first
    return _tap_sum(taps, wf), torch.cat([state[..., 1:], taps[-1].unsqueeze(-1)], dim=-1)


def _tap_sum(taps: list[torch.Tensor], wf: torch.Tensor) -> torch.Tensor:
    """sum_j wf[:, j] * taps[j] (taps oldest first, [R, C] each), newest tap first."""
    y = taps[-1] * wf[:, -1]
    for j in range(len(taps) - 1):
        y.addcmul_(taps[j], wf[:, j])
    return y


def _packed(
    x: torch.Tensor, wf: torch.Tensor, bounds: list[int], conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Any lengths (see the module docstring); bounds: the host cu_seqlens. Returns (y [T, C]
    fp32 before bias and activation, new state [N, C, W-1])."""
    T, C = x.shape
    N, W = conv_state.shape[0], wf.shape[-1]
    xf = x.float()
    y = xf * wf[:, -1]
    for j in range(W - 1):
        shift = W - 1 - j
        if shift < T:
            y[shift:].addcmul_(xf[: T - shift], wf[:, j])
    # windows of the first W-1 tokens of each sequence, and each new state, from one table:
    # rows [0, N*(W-1)) the states (oldest first), then the packed tokens
    source = torch.cat([conv_state.float().transpose(1, 2).reshape(-1, C), xf])
    lens = [bounds[i + 1] - bounds[i] for i in range(N)]
    head = [(i, p) for i in range(N) for p in range(min(W - 1, lens[i]))]
    if head:
        rows = torch.tensor([bounds[i] + p for i, p in head], device=x.device)
        taps = [_window_rows(head, j, bounds, N, W, x.device) for j in range(W)]
        y[rows] = _tap_sum([source.index_select(0, t) for t in taps], wf)
    tail = [(i, lens[i] + e) for i in range(N) for e in range(W - 1)]  # last W-1 of each window
    new_state = source.index_select(0, _window_rows(tail, 0, bounds, N, W, x.device))
    return y, new_state.view(N, W - 1, C).transpose(1, 2).contiguous()


def _window_rows(
    positions: list[tuple[int, int]], tap: int, bounds: list[int], N: int, W: int, device
) -> torch.Tensor:
    """Source-table row of element `e + tap` of sequence i's window (state_i ++ x_i), for each
    (i, e) of `positions`."""
    rows = []
    for i, e in positions:
        e += tap
        rows.append(i * (W - 1) + e if e < W - 1 else N * (W - 1) + bounds[i] + e - (W - 1))
    return torch.tensor(rows, dtype=torch.long, device=device)


def conv_boundary_rows(
    cu_seqlens_host: list[int], state_boundaries: Sequence[Sequence[int]], width: int
) -> list[int]:
    """Rows of the table [N*(W-1) carried-state rows (oldest first) ; T packed tokens] that make
    the conv state after b new tokens of sequence i (window elements b .. b+W-2 of
    state_i ++ x_i), for every b of `state_boundaries[i]`, sequence-major: M*(W-1) ints."""
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
    """`reference.conv_states_at` as one gather: x [T, C], conv_state [N, C, W-1] (zeros for a
    sequence without history), rows [M*(W-1)] int64 from `conv_boundary_rows`, on x's device.
    Returns [M, C, W-1] in conv_state's dtype, equal to the reference (copies only)."""
    C, W, N = x.shape[1], width, conv_state.shape[0]
    M = rows.numel() // (W - 1) if W > 1 else 0
    if M == 0:
        return x.new_zeros(0, C, W - 1, dtype=conv_state.dtype)
    head = conv_state.to(x.dtype).transpose(1, 2).reshape(N * (W - 1), C)
    picked = torch.cat([head, x]).index_select(0, rows)
    return picked.view(M, W - 1, C).transpose(1, 2).to(conv_state.dtype).contiguous()
