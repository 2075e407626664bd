"""Several projections of one input as one matmul: their weights become views of consecutive
row blocks of one tensor, so `x @ block^T` replaces a matmul per projection and a concatenation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def adjacent_rows(weights: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The [sum D_i, D_in] view whose row blocks are `weights` (back to back), or None."""
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
    """Re-home bias-free `linears`' weights (and fp8 block scales) as row blocks of one tensor,
    each Parameter's data a view; a no-op for < 2 modules, mixed dtypes or misaligned fp8 blocks."""
    weights = [m.weight for m in linears]
    if len(weights) < 2 or len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
        return
    if weights[0].dtype.itemsize == 1:
        if not fp8_blocks_line_up(linears):
            return
        _restack([m.weight_scale_inv for m in linears])
    _restack(weights)


def fp8_blocks_line_up(linears: Sequence[nn.Module]) -> bool:
    """One block size, and every weight but the last a whole number of bn rows."""
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
