"""Paged causal grouped-query attention over a packed varlen batch (dense softmax, explicit mask).

Sequence i has `seq_lens[i]` tokens in its cache (context plus this step's new tokens, all
already written) and `q_i = cu_seqlens[i+1] - cu_seqlens[i]` query rows, the last q_i tokens:

    cached tokens:  0 1 2 ... L-q_i ... L-1
    query row j  -> position L - q_i + j, attends to tokens 0 .. L - q_i + j
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.paged import gather_paged


def causal_mask(num_queries: int, seq_len: int, device: torch.device | str) -> torch.Tensor:
    """[num_queries, seq_len] bool, True where the query (the last `num_queries` tokens of a
    `seq_len`-token sequence) may attend to the key."""
    q_pos = torch.arange(seq_len - num_queries, seq_len, device=device)
    return torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention with an explicit boolean mask (every row needs one True).

    Args:
        q: [Tq, H, K]; k: [S, H, K]; v: [S, H, V]; mask: [Tq, S] bool (True = attend).
        scale: multiplies q.k before the softmax.
    Returns: [Tq, H, V] in q's dtype; softmax in float32 (as HF `eager_attention_forward`).
    """
    scores = torch.einsum("qhk,shk->hqs", q, k) * scale
    scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.einsum("hqs,shv->qhv", probs, v)


def paged_gqa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal GQA of each sequence's new tokens over its paged K/V.

    Args:
        q: [T, H, K] queries of the packed new tokens (rope already applied).
        k_cache: [P, B, HKV, K]; v_cache: [P, B, HKV, V]; H is a multiple of HKV, query head h
            reads kv head h // (H // HKV).
        block_tables: [N, max_blocks] int32.
        cu_seqlens: [N + 1] int32 offsets of each sequence's rows in q.
        seq_lens: N host ints, cached tokens per sequence (including the new ones).
        scale: softmax scale.
        k_scale, v_scale: [P, B, HKV] float32 per-token, per-head scales of an fp8 cache.
    Returns: [T, H, V] in q's dtype.
    Raises: ValueError when H is not a multiple of HKV.
    """
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"paged_gqa: {num_heads} query heads, {num_kv_heads} kv heads")
    group = num_heads // num_kv_heads
    out = q.new_empty(q.shape[0], num_heads, v_cache.shape[-1])
    cu = cu_seqlens.tolist()
    for i, seq_len in enumerate(seq_lens):
        start, end = cu[i], cu[i + 1]
        if end == start:
            continue
        k = gather_paged(k_cache, block_tables[i], seq_len, k_scale).to(q.dtype)  # [L, HKV, K]
        v = gather_paged(v_cache, block_tables[i], seq_len, v_scale).to(q.dtype)
        k = k.repeat_interleave(group, dim=1)  # [L, H, K]
        v = v.repeat_interleave(group, dim=1)
        mask = causal_mask(end - start, seq_len, q.device)
        out[start:end] = masked_attention(q[start:end], k, v, mask, scale)
    return out
