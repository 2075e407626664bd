"""Dense causal MLA with the lengths on the device: only the host bound `max_seq_len` shapes the
work, so a captured CUDA graph replays with other lengths."""

from __future__ import annotations

import torch

from hyla.ops.dsa_indexer.rows import gather_rows_bounded
from hyla.ops.gpu import use_triton
from hyla.ops.mla.reference import absorb_query, project_values, split_kv_b


def mla_paged(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal MLA of every packed row over positions 0 .. its own; args as
    `reference.mla_absorbed`, but seq_lens: [N] device tensor bounded by the host `max_seq_len`;
    rows: `row_positions(...)`."""
    args = (q_nope, q_rope, latent_cache, block_tables, cu_seqlens, seq_lens, max_seq_len)
    if use_triton(q_nope):
        from hyla.ops.mla import kernels

        return kernels.mla_paged(*args, kv_b_weight, scale, rows=rows, latent_scale=latent_scale)
    return mla_paged_reference(*args, kv_b_weight, scale, rows=rows, latent_scale=latent_scale)


def mla_paged_reference(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`mla_paged` in PyTorch (invisible slots may hold NaN: masked)."""
    num_rows, num_heads, dn = q_nope.shape
    w_uk, w_uv = split_kv_b(kv_b_weight, num_heads, dn)
    rank = w_uk.shape[-1]
    (latents,), visible = gather_rows_bounded(
        [latent_cache],
        block_tables,
        cu_seqlens,
        seq_lens,
        max_seq_len,
        num_rows,
        rows=rows,
        scales=[latent_scale],
    )
    latents = latents.to(q_nope.dtype).masked_fill(~visible[..., None], 0.0)
    query = torch.cat([absorb_query(q_nope, w_uk), q_rope], dim=-1)
    scores = torch.einsum("thc,tlc->thl", query, latents) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q_nope.dtype)
    o_lat = torch.einsum("thl,tlr->thr", probs, latents[..., :rank])
    return project_values(o_lat, w_uv)
