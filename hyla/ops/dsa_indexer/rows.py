"""Packed-row bookkeeping for DSA on the device, in plain PyTorch (no host sync): which
sequence and position each packed row is, and the causal "every visible token" selection that
replaces the indexer for sequences no longer than top-k. Used by the Triton kernels and by
`DSAttention`'s GPU path; runs on any device."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.paged.reference import _raw, dequantized


def row_sequences(cu_seqlens: torch.Tensor, num_rows: int) -> torch.Tensor:
    """[T] int32 sequence index of each packed row (cu_seqlens [N + 1] int32; on the device)."""
    rows = torch.arange(num_rows, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), rows, right=True).to(torch.int32)


def row_positions(
    cu_seqlens: torch.Tensor, seq_lens: Sequence[int] | torch.Tensor, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence and position of each packed row, computed on the device (no host sync).

    Args:
        cu_seqlens: [N + 1] int32 offsets; seq_lens: N host ints or an [N] int tensor on
            cu_seqlens' device (no host-to-device copy: what a captured CUDA graph needs);
            num_rows: T.
    Returns: (row_seq [T] int32, row_pos [T] int64): row t of sequence i sits at position
        seq_lens[i] - (cu_seqlens[i + 1] - t).
    """
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
    """The causal "every visible token" selection: row t at position p gets 0 .. min(p, k - 1).

    For rows with p < k this is exactly the set the indexer selects (all visible tokens), so
    `sparse_mla` over it is dense causal MLA and the indexer can be skipped; rows with p >= k
    get the first k positions, a placeholder the caller overwrites with the indexer's choice.

    Args:
        cu_seqlens: [N + 1] int32; seq_lens: N lengths including this step's tokens (host
            ints or a device tensor, as `row_positions`);
        topk: k; num_rows: T (= cu_seqlens[-1], passed to avoid a host sync).
    Returns: [T, k] int32 positions ascending, -1 padded. Any device (pure PyTorch).
    """
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
    """Each packed row's entries of each paged cache at positions 0 .. max_seq_len - 1 of its
    sequence: the gather of the bounded (device-length) references of MLA, GQA and the indexer.

    Args:
        caches: [P, B, ...] each; block_tables: [N, >= ceil(max_seq_len / B)] int32;
        cu_seqlens: [N + 1] int32; seq_lens: as `row_positions`; max_seq_len: host bound L;
        num_rows: T; rows: `row_positions(cu_seqlens, seq_lens, num_rows)` when the caller has it;
        scales: per cache, the per-vector scales of an fp8 cache ([P, B, ...] without the last
        dim) or None.
    Returns: (entries: [T, L, ...] per cache in its dtype (float32, dequantized, where a scale
        is given), unmasked: positions past a row's own may hold anything, NaN included;
        visible: [T, L] bool, position <= the row's).
    """
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    block = caches[0].shape[1]
    pos = torch.arange(max_seq_len, device=cu_seqlens.device)
    slots = block_tables.long()[:, pos // block] * block + pos % block  # [N, L]
    rows = slots[row_seq.long()]  # [T, L]
    scales = scales or [None] * len(caches)
    entries = [
        dequantized(_raw(cache.flatten(0, 1))[rows].view(cache.dtype),
                    None if scale is None else scale.flatten(0, 1)[rows])
        for cache, scale in zip(caches, scales, strict=True)
    ]  # fmt: skip
    return entries, pos[None, :] <= row_pos[:, None]
