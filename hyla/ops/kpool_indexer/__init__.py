"""Pooled DSA indexer (GLM-5.3-Flash `index_kpool`); lengths are read on the device."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.gpu import use_triton
from hyla.ops.kpool_indexer import reference
from hyla.ops.kpool_indexer.reference import compress_pools

__all__ = ["compress_pools", "kpool_indexer_topk", "write_pool_keys"]


def write_pool_keys(
    key_cache: torch.Tensor,
    gate_cache: torch.Tensor,
    pool_key_cache: torch.Tensor,
    ape: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    slot_mapping: torch.Tensor,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    args = (key_cache, gate_cache, pool_key_cache, ape, block_tables, cu_seqlens, seq_lens,
            slot_mapping, rows)  # fmt: skip
    if use_triton(key_cache):
        from hyla.ops.kpool_indexer import kernels

        return kernels.write_pool_keys(*args)
    return reference.write_pool_keys(*args)


def kpool_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    pool_key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    max_seq_len: int,
    topk: int,
    kpool: int,
    always_select_tail: bool,
    softmax_scale: float,
    *,
    static_shapes: bool = False,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """`reference.kpool_indexer_topk`; static_shapes: a captured step (graph-fastest top-k)."""
    args = (q, weights, pool_key_cache, block_tables, cu_seqlens, seq_lens, max_seq_len, topk,
            kpool, always_select_tail, softmax_scale)  # fmt: skip
    if use_triton(q):
        from hyla.ops.kpool_indexer import kernels

        return kernels.kpool_indexer_topk(*args, static_shapes=static_shapes, rows=rows)
    return reference.kpool_indexer_topk(*args, rows=rows)
