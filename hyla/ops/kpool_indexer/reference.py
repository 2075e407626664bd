"""GLM-5.3-Flash's pooled DSA indexer (`index_kpool`; transformers' `Glm5NextTextIndexer`):
the lightning indexer scores groups of P = `index_kpool` consecutive tokens instead of single
tokens, and a query attends to the tokens of its best `index_topk / P` pools plus its tail.

    pool j          tokens jP .. jP + P - 1, complete once token jP + P - 1 exists
    pool key j      sum_i softmax_i(gate[jP + i] + ape[i]) * key[jP + i]   (per channel)
    query at p      sees the complete pools j with jP + P - 1 <= p, i.e. (p + 1) // P of them;
                    score_j = sum_h w_h Hi^-0.5 relu(scale q_h . poolkey_j) (as `indexer_scores`)
    selection       tokens of the best min(topk / P, visible) pools (ties: lower pool first)
                    + the tail (p + 1) // P * P .. p, when `always_select_tail`

Cache (paged, per token): `index_keys` (normed key), `index_gates` (gate scores before `ape`)
and `index_pool_keys`: the key of pool j is written once, at the slot of its last token
jP + P - 1, by the step that writes that token. Decode then reads one entry per pool and never
recompresses history. The entries of `index_pool_keys` at other positions are scratch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.dsa_indexer.reference import select_topk
from hyla.ops.dsa_indexer.rows import row_positions
from hyla.ops.paged import write_paged


def compress_pools(keys: torch.Tensor, gates: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """keys, gates [n, P, Di], ape [P, Di] -> pool keys [n, Di] in keys' dtype (softmax over
    the P tokens per channel in float32)."""
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
    """Write the key of every pool that this step's rows complete (this step's keys and gates
    already in their caches). Each row writes its own slot: the compression of its last P
    tokens (positions clamped at 0), which is pool key (p + 1) / P - 1 when (p + 1) % P == 0
    and an unread scratch value otherwise (so no row needs a host-side filter).

    Args:
        key_cache, gate_cache, pool_key_cache: [Pg, B, Di]; ape: [P, Di];
        block_tables: [N, max_blocks] int32; cu_seqlens: [N + 1] int32; seq_lens: N lengths
        including this step's tokens; slot_mapping: [T] each row's own slot; rows:
        `row_positions(cu_seqlens, seq_lens, T)` when the caller has them.
    """
    num_rows, kpool, block = slot_mapping.shape[0], ape.shape[0], key_cache.shape[1]
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    window = (row_pos[:, None] - kpool + 1 + torch.arange(kpool, device=row_pos.device)).clamp(0)
    slots = _slots(block_tables, row_seq.long()[:, None], window, block)  # [T, P]
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
    """q [T, Hi, Di], weights [T, Hi], keys [N, Np, Di], row_seq [T] -> scores [T, Np] fp32,
    in row chunks of at most SCORE_ELEMENTS gathered key and per-head score elements."""
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
    """Each new row's selected token positions (module docstring).

    Args:
        q: [T, Hi, Di] indexer queries; weights: [T, Hi] `weights_proj` outputs (unscaled);
        pool_key_cache: [Pg, B, Di] with this step's pools written (`write_pool_keys`);
        block_tables: [N, max_blocks] int32; cu_seqlens: [N + 1] int32; seq_lens: N lengths
        including this step's tokens (host ints or a device tensor); max_seq_len: a host bound
        on them (sizes the work, no device read); topk: `index_topk`; kpool: P; rows: as
        `write_pool_keys`.
    Returns: [T, topk + P - 1] int32 positions (without the tail: [T, topk]), -1 padded, no
        duplicates; pools best first, then the tail ascending.
    """
    num_rows = q.shape[0]
    device = q.device
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    num_pools = max(max_seq_len // kpool, 1)
    pool_ends = torch.arange(num_pools, device=device) * kpool + kpool - 1  # [Np]
    block = pool_key_cache.shape[1]
    seqs = torch.arange(block_tables.shape[0], device=device)[:, None]
    ends = pool_ends.clamp(max=block_tables.shape[1] * block - 1)
    keys = pool_key_cache.flatten(0, 1)[_slots(block_tables, seqs, ends, block)]  # [N, Np, Di]
    scores = _pool_scores(q, weights, keys, row_seq.long(), softmax_scale)  # [T, Np]
    visible = (row_pos + 1) // kpool  # complete pools each row sees
    pools = select_topk(scores, visible, topk // kpool).long()  # [T, topk / P]
    offsets = torch.arange(kpool, device=device)
    tokens = torch.where(pools[..., None] >= 0, pools[..., None] * kpool + offsets, -1)
    selected = tokens.flatten(1)  # [T, topk]
    if not always_select_tail:
        return selected.to(torch.int32)
    tail = visible[:, None] * kpool + offsets[: kpool - 1]  # [T, P - 1]
    tail = tail.masked_fill(tail > row_pos[:, None], -1)
    return torch.cat([selected, tail], dim=1).to(torch.int32)
