"""Short causal conv with every sequence at once: the fast path of `reference.causal_conv1d`
(same signature and results; tests/ops/test_short_conv.py holds them together).

All sequences' extended windows (carried state, then the new tokens) are laid end to end in one
table, so each tap is one shifted slice of it and there is no loop over sequences:

    ext rows:  | s0 state (W-1) | s0 tokens (q0) | s1 state (W-1) | s1 tokens (q1) | ...
    y[t] = sum_j weight[:, j] * ext[r_t + j],   r_t = t + seq(t) * (W - 1)

Rows r whose window straddles two sequences are computed too and never read.
"""

from __future__ import annotations

import torch

from hyla.ops.short_conv.reference import ACTIVATIONS, check_conv_inputs

_ROW_BLOCK = 128  # rows of [R, C] per tap pass (128 x 1536 fp32 = 768 KB)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.causal_conv1d` vectorized over sequences; see it for arguments and results.

    Args:
        x: [T, C]; weight: [C, W]; bias: [C] or None; cu_seqlens: [N + 1] int32;
        conv_state: [N, C, W - 1] or None for zeros; activation: "silu", "sigmoid" or None.
    Returns: y [T, C] in x's dtype (fp32 compute); new_conv_state [N, C, W - 1].
    Raises: ValueError: inconsistent shapes or an unknown activation.
    """
    check_conv_inputs(x, weight, cu_seqlens, conv_state, activation)
    T, C = x.shape
    W = weight.shape[-1]
    N = cu_seqlens.numel() - 1
    state_dtype = x.dtype if conv_state is None else conv_state.dtype
    if conv_state is None:
        conv_state = torch.zeros(N, C, W - 1, dtype=state_dtype, device=x.device)
    if T == N and N > 0 and bool((cu_seqlens[1:] - cu_seqlens[:-1] == 1).all()):
        y, new_state = _one_token_each(x, weight.float(), conv_state)
    else:
        y, new_state = _packed(x, weight.float(), cu_seqlens, conv_state)
    if bias is not None:
        y = y + bias.float()
    if activation is not None:
        y = ACTIVATIONS[activation](y)
    return y.to(x.dtype), new_state.to(state_dtype)


def _one_token_each(
    x: torch.Tensor, wf: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: sequence i's window is its state then x[i]. Returns (y [N, C] fp32 before bias
    and activation, new state [N, C, W-1]). Same arithmetic as `_sliding_taps`."""
    state = conv_state.float()
    W = wf.shape[-1]
    taps = [state[..., j] for j in range(W - 1)] + [x.float()]  # oldest first, [N, C] each
    y = taps[0] * wf[:, 0]
    for j in range(1, W):
        y.addcmul_(taps[j], wf[:, j])
    return y, torch.cat([state[..., 1:], taps[-1].unsqueeze(-1)], dim=-1)


def _packed(
    x: torch.Tensor, wf: torch.Tensor, cu_seqlens: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Any lengths, through the end-to-end window table of the module docstring. Returns
    (y [T, C] fp32 before bias and activation, new state [N, C, W-1])."""
    T, C = x.shape
    N, W = conv_state.shape[0], wf.shape[-1]
    starts = cu_seqlens[:-1].long()
    lens = cu_seqlens[1:].long() - starts
    seq = torch.repeat_interleave(torch.arange(N, device=x.device), lens, output_size=T)
    token_rows = torch.arange(T, device=x.device) + (seq + 1) * (W - 1)  # x[t] in ext
    state_rows = (starts + torch.arange(N, device=x.device) * (W - 1))[:, None] + torch.arange(
        W - 1, device=x.device
    )  # [N, W-1]
    ext = torch.empty(N * (W - 1) + T, C, dtype=torch.float32, device=x.device)
    ext.index_copy_(0, state_rows.reshape(-1), conv_state.float().transpose(1, 2).reshape(-1, C))
    ext.index_copy_(0, token_rows, x.float())
    y = _sliding_taps(ext, wf).index_select(0, token_rows - (W - 1))
    new_state = ext.index_select(0, (state_rows + lens[:, None]).reshape(-1))
    return y, new_state.view(N, W - 1, C).transpose(1, 2).contiguous()


def _sliding_taps(ext: torch.Tensor, wf: torch.Tensor) -> torch.Tensor:
    """out[r] = sum_j wf[:, j] * ext[r + j] for every r with a full window ([R - W + 1, C]),
    in blocks of rows that stay in cache across the W taps."""
    W = wf.shape[-1]
    span = ext.shape[0] - W + 1
    out = torch.empty(span, ext.shape[1], dtype=ext.dtype, device=ext.device)
    for r in range(0, span, _ROW_BLOCK):
        rows = slice(r, min(r + _ROW_BLOCK, span))
        block = torch.mul(ext[rows], wf[:, 0], out=out[rows])
        for j in range(1, W):
            block.addcmul_(ext[rows.start + j : rows.stop + j], wf[:, j])
    return out
