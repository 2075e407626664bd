"""Indexer sort keys for the top-k tests: built as the scoring kernel writes them
(`hyla/ops/dsa_indexer/kernels.py`), from score patterns that stress the tie-break."""

from __future__ import annotations

import torch

LOW31 = (1 << 31) - 1
INVISIBLE = -(1 << 62) - 1


def sort_keys(scores: torch.Tensor, row_pos: torch.Tensor) -> torch.Tensor:
    """[R, L] fp32 scores -> int64 keys, as the scoring kernel writes them (kernels.py)."""
    bits = (scores.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    key32 = torch.where(bits >= 0, bits, bits ^ LOW31).long()
    cols = torch.arange(scores.shape[1], device=scores.device)
    keys = (key32 << 31) | (LOW31 - cols)
    return torch.where(cols[None, :] <= row_pos[:, None], keys, INVISIBLE)


def random_scores(num_rows: int, num_cols: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(num_rows, num_cols, generator=gen) * 10
    if kind == "ties":  # few distinct values, both signs, -0.0 and +0.0: ties break by column
        s = torch.randint(-3, 4, (num_rows, num_cols), generator=gen) * 0.25
        zero = torch.rand(num_rows, num_cols, generator=gen) < 0.3
        return torch.where(zero & (s == 0), -0.0, s)
    if kind == "constant":  # every score equal: the column digits decide alone
        return torch.zeros(num_rows, num_cols)
    if kind == "extremes":  # +-inf, subnormals, huge values, and a cluster of near-equal ones
        s = torch.randn(num_rows, num_cols, generator=gen)
        pick = torch.randint(0, 6, (num_rows, num_cols), generator=gen)
        s = torch.where(pick == 0, float("inf"), s)
        s = torch.where(pick == 1, float("-inf"), s)
        s = torch.where(pick == 2, s * 1e-42, s)
        s = torch.where(pick == 3, s * 1e37, s)
        return torch.where(pick == 4, 1.0 + s * 1e-6, s)
    raise ValueError(kind)
