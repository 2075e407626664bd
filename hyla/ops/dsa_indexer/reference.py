"""DSA lightning indexer (DeepSeek-V3.2-Exp report section 2.1; HF `DeepseekV32Indexer`, without
the orthogonal Hadamard rotation) in fp32. Top-k ties go to the lower token index."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.dsa_indexer.rows import gather_rows_bounded
from hyla.ops.gqa.reference import causal_mask
from hyla.ops.paged import gather_paged


def indexer_scores(
    q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, softmax_scale: float
) -> torch.Tensor:
    """Unmasked scores [Tq, S] fp32 of q [Tq, Hi, Di], weights [Tq, Hi] (unscaled), keys [S, Di]."""
    num_heads = q.shape[1]
    per_head = torch.relu(torch.einsum("thd,sd->ths", q.float(), keys.float()) * softmax_scale)
    w = weights.float() * (num_heads**-0.5)
    return torch.einsum("th,ths->ts", w, per_head)


def select_topk(scores: torch.Tensor, num_visible: torch.Tensor, topk: int) -> torch.Tensor:
    """[Tq, k] int32 best columns of scores [Tq, S] among the first `num_visible[t]`, -1 padded."""
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
    """Causal top-k per new token. q: [T, Hi, Di]; weights: [T, Hi]; index_key_cache: [P, B, Di];
    seq_lens: N host ints including this step. Returns [T, k] int32 positions, -1 padded."""
    out = torch.full((q.shape[0], topk), -1, dtype=torch.int32, device=q.device)
    cu = cu_seqlens.tolist()
    for i, seq_len in enumerate(seq_lens):
        start, end = cu[i], cu[i + 1]
        if end == start:
            continue
        keys = gather_paged(index_key_cache, block_tables[i], seq_len)
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
    """`lightning_indexer_topk`, seq_lens an [N] device tensor <= `max_seq_len`."""
    num_rows = q.shape[0]
    (keys,), visible = gather_rows_bounded(
        [index_key_cache], block_tables, cu_seqlens, seq_lens, max_seq_len, num_rows
    )
    keys = keys.float()
    per_head = torch.relu(torch.einsum("thd,tsd->ths", q.float(), keys) * softmax_scale)
    w = weights.float() * (q.shape[1] ** -0.5)
    scores = torch.einsum("th,ths->ts", w, per_head)
    return select_topk(scores, visible.sum(dim=1), topk)
