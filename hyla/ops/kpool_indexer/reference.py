"""GLM-5.3-Flash's pooled DSA indexer (`index_kpool`; transformers' `Glm5NextTextIndexer`): a
query at p reads the tokens of its best topk / P of the (p + 1) // P complete pools of P tokens
(plus its tail with `always_select_tail`). Pool j's key is written once, at the slot of token jP
+ P - 1."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.dsa_indexer.reference import select_topk
from hyla.ops.dsa_indexer.rows import row_positions
from hyla.ops.paged import write_paged


def compress_pools(keys: torch.Tensor, gates: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """keys, gates [n, P, Di], ape [P, Di] -> pool keys [n, Di] in keys' dtype (fp32 softmax)."""
    probs = torch.softmax(gates.float() + ape.float(), dim=1).to(keys.dtype)
    return (probs * keys).sum(dim=1)


def _slots(block_tables: torch.Tensor, seq_ids: torch.Tensor, pos: torch.Tensor, block: int):
    return block_tables.long()[seq_ids, pos // block] * block + pos % block


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
    """Write the key of every pool this step's rows complete: each row writes its slot with its
    last P tokens' compression, a pool key when (p + 1) % P == 0, else unread scratch (no host
    filter)."""
    num_rows, kpool, block = slot_mapping.shape[0], ape.shape[0], key_cache.shape[1]
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    window = (row_pos[:, None] - kpool + 1 + torch.arange(kpool, device=row_pos.device)).clamp(0)
    slots = _slots(block_tables, row_seq.long()[:, None], window, block)
    keys = key_cache.flatten(0, 1)[slots]
    gates = gate_cache.flatten(0, 1)[slots]
    pooled = compress_pools(keys, gates, ape)
    write_paged(pool_key_cache, slot_mapping, pooled)


# rows scored at once: bounds the [rows, Np, Di] key gather of a long prefill chunk
SCORE_ELEMENTS = 1 << 26


def _pool_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    row_seq: torch.Tensor,
    softmax_scale: float,
) -> torch.Tensor:
    num_heads, num_pools, dim = q.shape[1], keys.shape[1], keys.shape[2]
    step = max(1, SCORE_ELEMENTS // (num_pools * (dim + num_heads)))
    w = weights.float() * num_heads**-0.5
    parts = []
    for r in range(0, q.shape[0], step):
        rows = slice(r, r + step)
        dots = torch.einsum("thd,tpd->thp", q[rows].float(), keys[row_seq[rows]].float())
        parts.append(torch.einsum("th,thp->tp", w[rows], torch.relu(dots * softmax_scale)))
    return torch.cat(parts) if parts else q.new_zeros(0, num_pools, dtype=torch.float32)


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
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """[T, topk + P - 1] int32 positions ([T, topk] without the tail), -1 padded: pools best
    first, then the tail. max_seq_len: a host bound on seq_lens that sizes the work."""
    num_rows = q.shape[0]
    device = q.device
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    num_pools = max(max_seq_len // kpool, 1)
    pool_ends = torch.arange(num_pools, device=device) * kpool + kpool - 1
    block = pool_key_cache.shape[1]
    seqs = torch.arange(block_tables.shape[0], device=device)[:, None]
    ends = pool_ends.clamp(max=block_tables.shape[1] * block - 1)
    keys = pool_key_cache.flatten(0, 1)[_slots(block_tables, seqs, ends, block)]
    scores = _pool_scores(q, weights, keys, row_seq.long(), softmax_scale)
    visible = (row_pos + 1) // kpool
    pools = select_topk(scores, visible, topk // kpool).long()
    offsets = torch.arange(kpool, device=device)
    tokens = torch.where(pools[..., None] >= 0, pools[..., None] * kpool + offsets, -1)
    selected = tokens.flatten(1)
    if not always_select_tail:
        return selected.to(torch.int32)
    tail = visible[:, None] * kpool + offsets[: kpool - 1]
    tail = tail.masked_fill(tail > row_pos[:, None], -1)
    return torch.cat([selected, tail], dim=1).to(torch.int32)
