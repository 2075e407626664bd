"""Paged causal GQA with the lengths on the device: the form a captured decode step needs
(`hyla.engine.cuda_graphs`), where nothing may depend on host lengths but a bound.

    row t of sequence i sits at position p = seq_lens[i] - (cu_seqlens[i + 1] - t)
    keys and values of positions 0 .. max_seq_len - 1 gathered per row through the block table,
    positions > p masked (their slots may hold anything, NaN included), then softmax attention

Same result as `reference.paged_gqa` (tests/ops/test_gqa.py holds them together), at the cost of
gathering every row's keys and values up to the bound ([T, max_seq_len, HKV, K] each): meant for
decode steps, whose T * max_seq_len `hyla.engine.cuda_graphs` bounds (`GATHER_ROWS`).
"""

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
    """Causal GQA of every packed row over its sequence's paged K/V (no host read).

    Args:
        q: [T, H, K] roped queries; k_cache: [P, B, HKV, K]; v_cache: [P, B, HKV, V]; query
            head h reads kv head h // (H // HKV).
        block_tables: [N, max_blocks] int32 (at least ceil(max_seq_len / B) columns);
        cu_seqlens: [N + 1] int32.
        seq_lens: [N] int32 or int64 device tensor, cached tokens per sequence (this step's
            included); max_seq_len: host int >= every entry.
        scale: softmax scale; k_scale, v_scale: [P, B, HKV] float32 scales of an fp8 cache.
    Returns: [T, H, V] in q's dtype; softmax in float32 (as `reference.masked_attention`).
    Raises: ValueError when H is not a multiple of HKV.
    """
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
    )  # [T, L, HKV, K] each, [T, L]
    k = k.to(q.dtype).masked_fill(~visible[..., None, None], 0.0)
    v = v.to(q.dtype).masked_fill(~visible[..., None, None], 0.0)
    qg = q.view(num_rows, num_kv_heads, group, -1)  # query head g * group + j reads kv head g
    scores = torch.einsum("tgjk,tlgk->tgjl", qg, k) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.einsum("tgjl,tlgv->tgjv", probs, v).reshape(num_rows, num_heads, -1)
