"""Several projections of one input as one matmul, without a second copy of their weights:
`stack_rows` moves the weights into consecutive row blocks of one new tensor (each module's
weight becomes a view of it), and `adjacent_rows` recognises such weights at call time and
returns the whole [sum D_i, D_in] block, so `x @ block^T` replaces one matmul per projection and
a concatenation (on a GPU: one kernel instead of n + 1 for a decode step's few rows).

    weights:  W_q [Dq, D] | W_k [Dk, D] | W_v [Dv, D]     views of one tensor, rows back to back
    block:    [Dq + Dk + Dv, D]                           x @ block^T = cat(x W_q^T, x W_k^T, ...)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def adjacent_rows(weights: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The [sum D_i, D_in] tensor whose consecutive row blocks are `weights` (each [D_i, D_in],
    contiguous, one storage, back to back, same dtype), as a view; None otherwise (host checks
    only: data pointers and shapes)."""
    first = weights[0]
    if first.dim() != 2 or not first.is_contiguous():
        return None
    cols, step, end = first.shape[1], first.element_size(), first.data_ptr()
    rows = 0
    for w in weights:
        if (
            w.dim() != 2 or w.shape[1] != cols or w.dtype != first.dtype
            or not w.is_contiguous() or w.data_ptr() != end
            or w.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
        ):  # fmt: skip
            return None
        rows += w.shape[0]
        end += w.numel() * step
    return first.as_strided((rows, cols), (cols, 1))


@torch.no_grad()
def stack_rows(linears: Sequence[nn.Module]) -> None:
    """Re-home the weights of bias-free `linears` (same input width, dtype and device) as
    consecutive row blocks of one new tensor; each `weight` stays the same Parameter, its data
    now a view. Values are unchanged. fp8 modules (a `weight_scale_inv` per (bn, bk) block of
    `block_size`) get their scales stacked alike, when the blocks line up: one block size and
    every part but the last a whole number of bn rows. A no-op for fewer than two modules,
    mixed dtypes or fp8 blocks that do not line up."""
    weights = [m.weight for m in linears]
    if len(weights) < 2 or len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
        return
    if weights[0].dtype.itemsize == 1:  # fp8 weights: their scales must stack too
        if not fp8_blocks_line_up(linears):
            return
        _restack([m.weight_scale_inv for m in linears])
    _restack(weights)


def fp8_blocks_line_up(linears: Sequence[nn.Module]) -> bool:
    """Whether fp8 projections' weights and block scales can be stacked row-wise into one fp8
    weight with one scale grid: one block size, every part but the last a multiple of bn rows."""
    blocks = {getattr(m, "block_size", None) for m in linears}
    if (
        len(blocks) != 1
        or None in blocks
        or not all(hasattr(m, "weight_scale_inv") for m in linears)
    ):
        return False
    bn = blocks.pop()[0]
    return all(m.weight.shape[0] % bn == 0 for m in linears[:-1])


def _restack(params: Sequence[torch.Tensor]) -> None:
    block = torch.cat([p.detach() for p in params])
    start = 0
    for p in params:
        p.data = block[start : start + p.shape[0]]
        start += p.shape[0]
