"""MLA absorbed form over one padded batch of all sequences, the decode fast path;
batch-invariant to fp32 rounding only (~1e-7), unlike the bitwise `reference.mla_absorbed`."""

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
    """`reference.mla_absorbed` batched; query_lens: host ints sparing a read of cu_seqlens."""
    num_heads, dn = q_nope.shape[1], q_nope.shape[2]
    w_uk, w_uv = split_kv_b(kv_b_weight, num_heads, dn)
    rank = w_uk.shape[-1]
    N, T = len(seq_lens), q_nope.shape[0]
    if T == 0:
        return q_nope.new_empty(0, num_heads, w_uv.shape[1])
    latents, valid = gather_paged_padded(latent_cache, block_tables, list(seq_lens), latent_scale)
    latents = latents.to(q_nope.dtype)
    if min(seq_lens) < latents.shape[1]:  # padding rows may hold anything, NaN included
        latents.masked_fill_(~valid[..., None], 0.0)
    query = torch.cat([absorb_query(q_nope, w_uk), q_rope], dim=-1)
    rows, mask = _query_layout(cu_seqlens, seq_lens, latents.shape[1], query_lens)
    Q = mask.shape[1]
    padded = query.new_zeros(N * Q, num_heads, query.shape[-1])
    padded[rows] = query
    scores = padded.view(N, Q * num_heads, -1) @ latents.transpose(1, 2)
    scores = (scores * scale).view(N, Q, num_heads, -1)
    scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q_nope.dtype)
    o_lat = probs.view(N, Q * num_heads, -1) @ latents[..., :rank]
    o_lat = o_lat.view(N * Q, num_heads, rank)[rows]
    return project_values(o_lat, w_uv)


def _query_layout(
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    num_keys: int,
    query_lens: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded query rows see their sequence's last row's keys, so no row is all -inf."""
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
    last_key = (lens - q_lens)[:, None] + torch.arange(Q, device=device)
    last_key = torch.minimum(last_key, lens[:, None] - 1)
    mask = torch.arange(num_keys, device=device) <= last_key[..., None]
    return rows, mask
