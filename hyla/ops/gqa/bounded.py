"""Paged causal GQA with the lengths on the device, for captured decode steps: gathers every
row's K/V up to `max_seq_len` ([T, max_seq_len, HKV, K]), so callers bound T * max_seq_len."""

from __future__ import annotations

import torch

from hyla.ops.dsa_indexer.rows import gather_rows_bounded


def paged_gqa_bounded(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`reference.paged_gqa` with seq_lens: [N] on the device and max_seq_len >= every entry."""
    num_rows, num_heads, _ = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"paged_gqa: {num_heads} query heads, {num_kv_heads} kv heads")
    group = num_heads // num_kv_heads
    (k, v), visible = gather_rows_bounded(
        [k_cache, v_cache],
        block_tables,
        cu_seqlens,
        seq_lens,
        max_seq_len,
        num_rows,
        scales=[k_scale, v_scale],
    )
    k = k.to(q.dtype).masked_fill(~visible[..., None, None], 0.0)
    v = v.to(q.dtype).masked_fill(~visible[..., None, None], 0.0)
    qg = q.view(num_rows, num_kv_heads, group, -1)
    scores = torch.einsum("tgjk,tlgk->tgjl", qg, k) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.einsum("tgjl,tlgv->tgjv", probs, v).reshape(num_rows, num_heads, -1)
