"""Token bitmasks on the device: bit j of word w of a row allows token 32 * w + j."""

from __future__ import annotations

import torch


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`bitmask: [m, W]` int32 -> allowed `[m, vocab_size]` bool (on the bitmask's device)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [m, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor | None
) -> torch.Tensor:
    """`logits: [n, V]` with rows `row_indices: [m]` (None: all) restricted to `bitmask: [m, W]`
    (disallowed: -inf); returns a new tensor."""
    allowed = unpack_bitmask(bitmask, logits.shape[1])
    if row_indices is None:
        return torch.where(allowed, logits, float("-inf"))
    rows = torch.where(allowed, logits.index_select(0, row_indices), float("-inf"))
    return logits.index_copy(0, row_indices, rows)
