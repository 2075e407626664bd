"""`mla_paged` on CUDA: bmm projections around `hyla.ops.sparse_attention.kernels` in dense mode."""

from __future__ import annotations

import torch

from hyla.ops.dsa_indexer.rows import row_positions
from hyla.ops.mla.reference import split_kv_b
from hyla.ops.sparse_attention.kernels import dense_latent_attention


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
    num_rows, num_heads, dn = q_nope.shape
    w_uk, w_uv = split_kv_b(kv_b_weight, num_heads, dn)
    q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
    row_seq, row_pos = rows if rows is not None else row_positions(cu_seqlens, seq_lens, num_rows)
    o_lat = dense_latent_attention(
        q_lat,
        q_rope,
        latent_cache,
        block_tables,
        row_seq,
        row_pos,
        max_seq_len,
        scale,
        latent_scale=latent_scale,
    )
    return torch.bmm(o_lat.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
