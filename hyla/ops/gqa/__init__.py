"""Paged causal grouped-query attention over a packed varlen batch (`reference.py`); `bounded.py`
takes the lengths on the device (captured decode steps), `kernels.py` is the Triton launch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.gqa import reference
from hyla.ops.gqa.bounded import paged_gqa_bounded
from hyla.ops.gqa.reference import causal_mask, masked_attention


def paged_gqa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`reference.paged_gqa`; `seq_lens` may be an [N] device tensor. An fp8 cache always takes
    the reference."""
    if use_triton(q) and k_scale is None and not needs_grad(q, k_cache, v_cache):
        from hyla.ops.gqa import kernels

        return kernels.paged_gqa(q, k_cache, v_cache, block_tables, cu_seqlens, seq_lens, scale)
    if isinstance(seq_lens, torch.Tensor):
        seq_lens = seq_lens.tolist()
    return reference.paged_gqa(
        q, k_cache, v_cache, block_tables, cu_seqlens, seq_lens, scale,
        k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip


__all__ = ["causal_mask", "masked_attention", "paged_gqa", "paged_gqa_bounded"]
