"""Top-k of the indexer's int64 sort keys in PyTorch; visible keys are unique per row."""

from __future__ import annotations

import torch

LOW31 = (1 << 31) - 1
# Below every visible key (a visible key is >= -2^62): marks columns a row does not see.
INVISIBLE = -(1 << 62) - 1
MAX_SEGMENTS = 64


def topk_columns_reference(keys: torch.Tensor, row_pos: torch.Tensor, topk: int) -> torch.Tensor:
    """[R, L] int64 sort keys -> [R, topk] int32 columns; -1 at ranks > row_pos or >= L."""
    k = min(topk, keys.shape[1])
    best = torch.topk(keys, k, dim=1, largest=True, sorted=True).values
    return columns_of(best, row_pos, topk)


def columns_of(best: torch.Tensor, row_pos: torch.Tensor, topk: int) -> torch.Tensor:
    k = best.shape[1]
    cols = LOW31 - (best & LOW31)
    rank = torch.arange(k, device=best.device)
    cols = torch.where(rank[None, :] <= row_pos[:, None], cols, -1).to(torch.int32)
    if k < topk:
        cols = torch.nn.functional.pad(cols, (0, topk - k), value=-1)
    return cols


def num_segments(num_cols: int, k: int, max_segments: int = MAX_SEGMENTS) -> int:
    """The most segments (a power of two <= max_segments) that split `num_cols` evenly into
    pieces of at least k columns; 1 when none does."""
    segments = 1
    while (
        segments * 2 <= max_segments
        and num_cols % (segments * 2) == 0
        and num_cols // (segments * 2) >= k
    ):
        segments *= 2
    return segments


def segmented_topk_columns(
    keys: torch.Tensor, row_pos: torch.Tensor, topk: int, max_segments: int = MAX_SEGMENTS
) -> torch.Tensor:
    """`topk_columns_reference` in two torch.topk stages (the best k of S segments, then of
    those); exact, as visible keys are unique; CUDA-graph safe."""
    num_rows, num_cols = keys.shape
    k = min(topk, num_cols)
    segments = num_segments(num_cols, k, max_segments)
    if segments == 1:
        return topk_columns_reference(keys, row_pos, topk)
    pieces = keys.reshape(num_rows * segments, num_cols // segments)
    candidates = torch.topk(pieces, k, dim=1, sorted=False).values
    best = torch.topk(candidates.view(num_rows, segments * k), k, dim=1, sorted=True).values
    return columns_of(best, row_pos, topk)
