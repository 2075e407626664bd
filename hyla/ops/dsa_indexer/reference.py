"""DeepSeek Sparse Attention lightning indexer (DeepSeek-V3.2-Exp report, section 2.1) over the
paged index-key cache, and a deterministic top-k selection.

    score[t, s] = sum_h (w[t, h] * Hi^-0.5) * relu(softmax_scale * q[t, h] . k[s]),  s <= pos(t)

as HF `DeepseekV32Indexer.forward` (`deepseek_v32/modeling_deepseek_v32.py`), which skips the
reference's Hadamard rotation (orthogonal: dot products are unchanged) and fp8 scoring. Scores are
computed in float32.

Top-k ties: equal scores are ordered by token index, lower first (a stable descending sort), so
the selection does not depend on the sort kernel or the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.dsa_indexer.rows import gather_rows_bounded
from hyla.ops.gqa.reference import causal_mask
from hyla.ops.paged import gather_paged


def indexer_scores(
    q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, softmax_scale: float
) -> torch.Tensor:
    """Unmasked lightning-indexer scores of queries against keys.

    Args:
        q: [Tq, Hi, Di] roped indexer queries.
        weights: [Tq, Hi] per-head weights (`weights_proj(x)`, before the Hi^-0.5 scaling).
        keys: [S, Di] roped, normed indexer keys.
        softmax_scale: Di^-0.5 in DeepSeek-V3.2.
    Returns: [Tq, S] float32.
    """
    num_heads = q.shape[1]
    per_head = torch.relu(torch.einsum("thd,sd->ths", q.float(), keys.float()) * softmax_scale)
    w = weights.float() * (num_heads**-0.5)
    return torch.einsum("th,ths->ts", w, per_head)


def select_topk(scores: torch.Tensor, num_visible: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-k token indices per row; only the first `num_visible[t]` columns compete.

    Args:
        scores: [Tq, S] float32.
        num_visible: [Tq] int64, columns 0 .. num_visible[t] - 1 are eligible (>= 1).
        topk: k.
    Returns: [Tq, k] int32, best first; equal scores: lower index first; -1 pads rows with
        fewer than k eligible columns.
    """
    num_cols = scores.shape[1]
    cols = torch.arange(num_cols, device=scores.device)
    eligible = cols[None, :] < num_visible[:, None]
    masked = scores.masked_fill(~eligible, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :topk]
    if order.shape[1] < topk:
        pad = order.new_full((order.shape[0], topk - order.shape[1]), -1)
        order = torch.cat([order, pad], dim=1)
    rank = torch.arange(topk, device=scores.device)
    order = order.masked_fill(rank[None, :] >= num_visible[:, None], -1)
    return order.to(torch.int32)


def lightning_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    topk: int,
    softmax_scale: float,
) -> torch.Tensor:
    """Causal lightning-indexer top-k for each new token of a packed varlen batch.

    Args:
        q: [T, Hi, Di] roped indexer queries of the new tokens.
        weights: [T, Hi] `weights_proj` outputs (unscaled).
        index_key_cache: [P, B, Di]; this step's keys already written.
        block_tables: [N, max_blocks] int32; cu_seqlens: [N + 1] int32.
        seq_lens: N host ints, cached tokens per sequence including this step's.
        topk: k; softmax_scale: see `indexer_scores`.
    Returns: [T, k] int32 token indices within each token's own sequence (0-based positions),
        best first, -1 padded where fewer than k tokens are visible (a token at position p sees
        p + 1 tokens).
    """
    out = torch.full((q.shape[0], topk), -1, dtype=torch.int32, device=q.device)
    cu = cu_seqlens.tolist()
    for i, seq_len in enumerate(seq_lens):
        start, end = cu[i], cu[i + 1]
        if end == start:
            continue
        keys = gather_paged(index_key_cache, block_tables[i], seq_len)  # [L, Di]
        scores = indexer_scores(q[start:end], weights[start:end], keys, softmax_scale)
        num_visible = causal_mask(end - start, seq_len, q.device).sum(-1)
        out[start:end] = select_topk(scores, num_visible, topk)
    return out


def lightning_indexer_topk_bounded(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    topk: int,
    softmax_scale: float,
) -> torch.Tensor:
    """`lightning_indexer_topk` with the lengths on the device: seq_lens [N] int tensor, bounded
    by the host int `max_seq_len`, which alone shapes the work (no host read; the CPU form of a
    captured decode step). Every row's keys are gathered to [T, max_seq_len, Di] and the
    columns past its position masked. Same result as `lightning_indexer_topk`."""
    num_rows = q.shape[0]
    (keys,), visible = gather_rows_bounded(
        [index_key_cache], block_tables, cu_seqlens, seq_lens, max_seq_len, num_rows
    )  # [T, L, Di], [T, L]
    keys = keys.float()
    per_head = torch.relu(torch.einsum("thd,tsd->ths", q.float(), keys) * softmax_scale)
    w = weights.float() * (q.shape[1] ** -0.5)
    scores = torch.einsum("th,ths->ts", w, per_head)
    return select_topk(scores, visible.sum(dim=1), topk)
