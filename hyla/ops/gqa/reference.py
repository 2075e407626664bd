"""Paged causal GQA over a packed varlen batch (dense softmax): the q_i query rows of sequence i
are its last q_i cached tokens (row j at position L - q_i + j)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.paged import gather_paged


def causal_mask(num_queries: int, seq_len: int, device: torch.device | str) -> torch.Tensor:
    """[num_queries, seq_len] bool for the last `num_queries` tokens as queries."""
    q_pos = torch.arange(seq_len - num_queries, seq_len, device=device)
    return torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention, fp32 softmax (HF `eager_attention_forward`). q: [Tq, H, K];
    k: [S, H, K]; v: [S, H, V]; mask: [Tq, S] (every row needs one True). Returns [Tq, H, V]."""
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
    """Causal GQA of each sequence's new tokens over its paged K/V. q: [T, H, K] roped;
    k_cache, v_cache: [P, B, HKV, K|V]; seq_lens: N host ints (new tokens included);
    k_scale, v_scale: [P, B, HKV] of an fp8 cache. Returns [T, H, V]; ValueError if H % HKV."""
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
        k = gather_paged(k_cache, block_tables[i], seq_len, k_scale).to(q.dtype)
        v = gather_paged(v_cache, block_tables[i], seq_len, v_scale).to(q.dtype)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        mask = causal_mask(end - start, seq_len, q.device)
        out[start:end] = masked_attention(q[start:end], k, v, mask, scale)
    return out
