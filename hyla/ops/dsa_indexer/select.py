"""Top-k of the lightning indexer's int64 sort keys in PyTorch (no triton): the definition
`topk_columns_reference` (one torch.topk) and `segmented_topk_columns` (two torch.topk stages
over segments of each row, for long rows; the same result). The key format (`kernels.py`):

    key = (key32 << 31) | (2^31 - 1 - column)    visible column (unique per row)
    key = INVISIBLE = -2^62 - 1                   invisible column (ranks last)
"""

from __future__ import annotations

import torch

LOW31 = (1 << 31) - 1
# Below every visible key (a visible key is >= -2^62): marks columns a row does not see.
INVISIBLE = -(1 << 62) - 1
MAX_SEGMENTS = 64  # segments per row of `segmented_topk_columns`


def topk_columns_reference(keys: torch.Tensor, row_pos: torch.Tensor, topk: int) -> torch.Tensor:
    """[R, L] int64 sort keys, [R] positions -> [R, topk] int32 columns (torch.topk).

    Rank r holds the column of the r-th largest key, or -1 where r > row_pos[r's row] or
    r >= L (the reference's padding rules)."""
    k = min(topk, keys.shape[1])
    best = torch.topk(keys, k, dim=1, largest=True, sorted=True).values
    return columns_of(best, row_pos, topk)


def columns_of(best: torch.Tensor, row_pos: torch.Tensor, topk: int) -> torch.Tensor:
    """[R, k] keys, best first -> [R, topk] int32 columns with the reference's -1 rules."""
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
    """`topk_columns_reference` in two torch.topk stages, for long rows: each row's columns are
    cut into S equal segments (`num_segments`), the best k of every segment are taken at once
    ([R * S] short rows: many thread blocks, where one long row gives the sort few), then the
    best k of those S k candidates, sorted. Exact: a row's k best keys are among its segments'
    k best (visible keys are unique; invisible ones rank last and become -1 either way).

    Args/Returns: as `topk_columns_reference` (keys [R, L] int64, row_pos [R] int64).
    Fixed shapes, no host sync: CUDA-graph safe."""
    num_rows, num_cols = keys.shape
    k = min(topk, num_cols)
    segments = num_segments(num_cols, k, max_segments)
    if segments == 1:
        return topk_columns_reference(keys, row_pos, topk)
    pieces = keys.reshape(num_rows * segments, num_cols // segments)
    candidates = torch.topk(pieces, k, dim=1, sorted=False).values
    best = torch.topk(candidates.view(num_rows, segments * k), k, dim=1, sorted=True).values
    return columns_of(best, row_pos, topk)
