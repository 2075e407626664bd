"""Packed-row bookkeeping for DSA in device-side PyTorch (no host sync)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.paged.reference import _raw, dequantized


def row_sequences(cu_seqlens: torch.Tensor, num_rows: int) -> torch.Tensor:
    rows = torch.arange(num_rows, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), rows, right=True).to(torch.int32)


def row_positions(
    cu_seqlens: torch.Tensor, seq_lens: Sequence[int] | torch.Tensor, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row_seq [T] int32, row_pos [T] int64); seq_lens: host ints or an [N] device tensor."""
    device = cu_seqlens.device
    row_seq = row_sequences(cu_seqlens, num_rows).long()
    rows = torch.arange(num_rows, device=device)
    if isinstance(seq_lens, torch.Tensor):
        lens = seq_lens.long()
    else:
        lens = torch.tensor(list(seq_lens), dtype=torch.long).to(device, non_blocking=True)
    row_pos = lens[row_seq] - (cu_seqlens.long()[row_seq + 1] - rows)
    return row_seq.to(torch.int32), row_pos


def dense_topk_indices(
    cu_seqlens: torch.Tensor, seq_lens: Sequence[int] | torch.Tensor, topk: int, num_rows: int
) -> torch.Tensor:
    """Causal "every visible token" selection [T, k] int32: the row at p gets 0 .. min(p, k - 1).
    For p < k this is the indexer's own choice, so `sparse_mla` over it is dense causal MLA."""
    _, row_pos = row_positions(cu_seqlens, seq_lens, num_rows)
    cols = torch.arange(topk, device=cu_seqlens.device)
    return torch.where(cols[None, :] <= row_pos[:, None], cols, -1).to(torch.int32)


def gather_rows_bounded(
    caches: Sequence[torch.Tensor],
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    max_seq_len: int,
    num_rows: int,
    *,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    scales: Sequence[torch.Tensor | None] | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each row's entries [T, L, ...] of each paged cache at positions 0 .. max_seq_len - 1 (fp32
    where dequantized; NaN possible past the row's position), and visible [T, L]."""
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    block = caches[0].shape[1]
    pos = torch.arange(max_seq_len, device=cu_seqlens.device)
    slots = block_tables.long()[:, pos // block] * block + pos % block
    rows = slots[row_seq.long()]
    scales = scales or [None] * len(caches)
    entries = [
        dequantized(_raw(cache.flatten(0, 1))[rows].view(cache.dtype),
                    None if scale is None else scale.flatten(0, 1)[rows])
        for cache, scale in zip(caches, scales, strict=True)
    ]  # fmt: skip
    return entries, pos[None, :] <= row_pos[:, None]
