"""DSA lightning indexer scores and deterministic causal top-k over the paged index-key cache.
See `reference.py`; CUDA tensors take the Triton path in `kernels.py` (same signature and result;
triton is imported only then)."""

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
    """Causal lightning-indexer top-k: `reference.lightning_indexer_topk` (args, [T, k] int32
    result), dispatched to `kernels.lightning_indexer_topk` for CUDA tensors.

    `index_key_scale` [P, B] float32: per-token scales of an fp8 (float8_e4m3fn) key cache
    (key = fp8 value * scale); None for bf16/fp32 keys. `max_seq_len` given: `seq_lens` is an
    [N] int device tensor bounded by it, and no host value but the bound shapes the work
    (`reference.lightning_indexer_topk_bounded` off CUDA). `static_shapes`: the call is part of
    a captured decode step (CUDA: selects the top-k form that is fastest in a graph; the result
    is the same).
    """
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
