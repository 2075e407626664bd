"""DSA lightning indexer and deterministic causal top-k over the paged index-key cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.dsa_indexer import reference
from hyla.ops.dsa_indexer.reference import indexer_scores, select_topk
from hyla.ops.gpu import use_triton


def lightning_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    topk: int,
    softmax_scale: float,
    index_key_scale: torch.Tensor | None = None,
    *,
    max_seq_len: int | None = None,
    static_shapes: bool = False,
) -> torch.Tensor:
    """`reference.lightning_indexer_topk`, by `kernels.py` for CUDA tensors. index_key_scale:
    [P, B] scales of an fp8 key cache. max_seq_len: a host bound on `seq_lens` given as an [N]
    device tensor. static_shapes: a captured decode step (picks the graph-fastest top-k)."""
    if use_triton(q):
        from hyla.ops.dsa_indexer import kernels

        return kernels.lightning_indexer_topk(
            q, weights, index_key_cache, block_tables, cu_seqlens, seq_lens, topk,
            softmax_scale, index_key_scale, max_seq_len=max_seq_len, static_shapes=static_shapes,
        )  # fmt: skip
    if index_key_scale is not None:
        index_key_cache = index_key_cache.float() * index_key_scale[..., None]
    if max_seq_len is not None:
        return reference.lightning_indexer_topk_bounded(
            q, weights, index_key_cache, block_tables, cu_seqlens, seq_lens, max_seq_len, topk,
            softmax_scale,
        )  # fmt: skip
    return reference.lightning_indexer_topk(
        q, weights, index_key_cache, block_tables, cu_seqlens, seq_lens, topk, softmax_scale
    )


__all__ = ["indexer_scores", "lightning_indexer_topk", "select_topk"]
