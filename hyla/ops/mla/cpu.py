"""MLA absorbed form with every sequence at once: the decode fast path beside
`reference.mla_absorbed` (same signature, same results within fp32 rounding; tests/ops/test_mla.py
holds them together).

The reference gathers and attends one sequence at a time. Here all sequences' latents are
gathered into one padded batch and attended with two batched matmuls; padded keys and padded
query rows are masked:

    latents  [N, L, R + Dr]   L = max seq_len, rows past a sequence's length zeroed
    queries  [N, Q, H, R + Dr] = [q_nope W_UK | q_rope], Q = max new tokens per sequence
    query row r of sequence n (q_n new tokens, seq_len L_n) sees keys s <= L_n - q_n + r

A key's score is one dot product over the whole latent row (`q_lat . c_kv + q_rope . k_rope`).

Batch transparency holds to fp32 rounding (~1e-7 relative), not bit for bit: the query
absorption runs as one matmul over all rows and the softmax over the padded length, whose
rounding depends on the neighbours. `reference.mla_absorbed`, one sequence at a time, stays
bitwise batch-transparent.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.mla.reference import absorb_query, project_values, split_kv_b
from hyla.ops.paged import gather_paged_padded


def mla_absorbed_batched(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    query_lens: Sequence[int] | None = None,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal MLA, absorbed form, batched over sequences (see `reference.mla_absorbed`).

    Args:
        q_nope: [T, H, Dn]; q_rope: [T, H, Dr].
        latent_cache: [P, B, R + Dr].
        block_tables: [N, max_blocks] int32; cu_seqlens: [N + 1] int32.
        seq_lens: N host ints, cached tokens per sequence including this step's (written).
        kv_b_weight: [H * (Dn + Dv), R]; scale: softmax scale.
        query_lens: N host ints, this step's tokens per sequence (cu_seqlens' differences);
            when given, the padded layout is built without reading cu_seqlens back (no device
            sync on a GPU).
        latent_scale: [P, B] float32 per-token scales of an fp8 latent cache, else None.
    Returns: [T, H, Dv] in q's dtype; softmax in float32.
    """
    num_heads, dn = q_nope.shape[1], q_nope.shape[2]
    w_uk, w_uv = split_kv_b(kv_b_weight, num_heads, dn)
    rank = w_uk.shape[-1]
    N, T = len(seq_lens), q_nope.shape[0]
    if T == 0:
        return q_nope.new_empty(0, num_heads, w_uv.shape[1])
    latents, valid = gather_paged_padded(latent_cache, block_tables, list(seq_lens), latent_scale)
    latents = latents.to(q_nope.dtype)  # [N, L, R + Dr]
    if min(seq_lens) < latents.shape[1]:  # padding rows may hold anything, NaN included
        latents.masked_fill_(~valid[..., None], 0.0)
    query = torch.cat([absorb_query(q_nope, w_uk), q_rope], dim=-1)  # [T, H, R + Dr]
    rows, mask = _query_layout(cu_seqlens, seq_lens, latents.shape[1], query_lens)
    Q = mask.shape[1]
    padded = query.new_zeros(N * Q, num_heads, query.shape[-1])
    padded[rows] = query
    scores = padded.view(N, Q * num_heads, -1) @ latents.transpose(1, 2)  # [N, Q*H, L]
    scores = (scores * scale).view(N, Q, num_heads, -1)
    scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q_nope.dtype)
    o_lat = probs.view(N, Q * num_heads, -1) @ latents[..., :rank]  # [N, Q*H, R]
    o_lat = o_lat.view(N * Q, num_heads, rank)[rows]
    return project_values(o_lat, w_uv)


def _query_layout(
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    num_keys: int,
    query_lens: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(padded row of each packed query [T] int64, mask [N, Q, L] bool). Padded query rows see
    the same keys as their sequence's last row, so no row is all -inf. With host `query_lens`
    the shapes come from them (no read of cu_seqlens)."""
    device = cu_seqlens.device
    starts = cu_seqlens[:-1].long()
    q_lens = cu_seqlens[1:].long() - starts
    N = q_lens.numel()
    if query_lens is None:
        Q, T = int(q_lens.max()), None
    else:
        Q, T = max(query_lens), sum(query_lens)
    seq = torch.repeat_interleave(torch.arange(N, device=device), q_lens, output_size=T)
    rows = seq * Q + torch.arange(seq.numel(), device=device) - starts[seq]
    lens = torch.tensor(list(seq_lens), dtype=torch.long, device=device)
    last_key = (lens - q_lens)[:, None] + torch.arange(Q, device=device)  # [N, Q]
    last_key = torch.minimum(last_key, lens[:, None] - 1)
    mask = torch.arange(num_keys, device=device) <= last_key[..., None]
    return rows, mask
