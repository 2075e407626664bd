"""Make a selection safe for sparse attention over a *set*: repeated, future or out-of-range
entries (double weight, unwritten or recycled slots) become -1. No host sync."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.dsa_indexer.rows import row_positions


def valid_topk_indices(
    topk_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
) -> torch.Tensor:
    """[T, k] int32 distinct positions 0 <= p <= the row's own, ascending after the -1 entries."""
    num_rows = topk_indices.shape[0]
    _, row_pos = row_positions(cu_seqlens, seq_lens, num_rows)
    idx = topk_indices.long()
    idx = idx.masked_fill((idx < 0) | (idx > row_pos[:, None]), -1)
    idx = idx.sort(dim=1).values
    repeat = torch.zeros_like(idx, dtype=torch.bool)
    repeat[:, 1:] = idx[:, 1:] == idx[:, :-1]
    return idx.masked_fill(repeat, -1).to(torch.int32)
