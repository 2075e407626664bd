"""Make a selection safe for sparse attention: the op attends to a *set* of visible tokens.

A selection built from pools (GLM-5.3-Flash's pooled indexer: pools expanded to their tokens,
plus the tail) or from any other source may hold entries the attention must not count: a token
listed twice (it would get twice its weight), a position after the row's own (the future), one
past the sequence's end or below -1 (a read of an unwritten or recycled cache slot). Each such
entry becomes -1 (skipped). Plain PyTorch on the indices' device, no host sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.dsa_indexer.rows import row_positions


def valid_topk_indices(
    topk_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
) -> torch.Tensor:
    """The selection with every entry the row may not attend to set to -1.

    Args:
        topk_indices: [T, k] int token positions within each row's sequence (-1: none).
        cu_seqlens: [N + 1] int32 row offsets; seq_lens: N lengths including this step's
            tokens (host ints or a device tensor).
    Returns: [T, k] int32: per row the distinct positions p with 0 <= p <= the row's own
        position, ascending after the -1 entries (the order carries no meaning: attention over
        a set).
    """
    num_rows = topk_indices.shape[0]
    _, row_pos = row_positions(cu_seqlens, seq_lens, num_rows)
    idx = topk_indices.long()
    idx = idx.masked_fill((idx < 0) | (idx > row_pos[:, None]), -1)
    idx = idx.sort(dim=1).values
    repeat = torch.zeros_like(idx, dtype=torch.bool)
    repeat[:, 1:] = idx[:, 1:] == idx[:, :-1]
    return idx.masked_fill(repeat, -1).to(torch.int32)
