"""Sparse MLA (DeepSeek-V3.2-Exp report section 2.1) in the absorbed latent form (DeepSeek-V2
appendix C): each query attends only to its selected tokens; -1 entries are never read."""

from __future__ import annotations

import torch

from hyla.ops.mla.reference import absorb_query, latent_attention, project_values, split_kv_b
from hyla.ops.paged import gather_paged_tokens
from hyla.ops.sparse_attention.indices import valid_topk_indices


def sparse_mla(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    topk_indices: torch.Tensor,
    kv_b_weight: torch.Tensor,
    scale: float,
    seq_lens: torch.Tensor | None = None,
    *,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q_nope: [T, H, Dn]; q_rope: [T, H, Dr]; latent_cache: [P, B, R + Dr]; topk_indices: [T, k]
    positions (-1: none); seq_lens: given, bad entries are dropped and an empty row is 0. Returns
    [T, H, Dv]. Raises ValueError when a row selects no token (without seq_lens)."""
    if seq_lens is not None:
        topk_indices = valid_topk_indices(topk_indices, cu_seqlens, seq_lens)
    num_heads, dn = q_nope.shape[1], q_nope.shape[2]
    w_uk, w_uv = split_kv_b(kv_b_weight, num_heads, dn)
    out = q_nope.new_empty(q_nope.shape[0], num_heads, w_uv.shape[1])
    cu = cu_seqlens.tolist()
    for i in range(len(cu) - 1):
        for t in range(cu[i], cu[i + 1]):
            selected = topk_indices[t][topk_indices[t] >= 0].long()
            if selected.numel() == 0 and seq_lens is not None:
                out[t] = 0
                continue
            if selected.numel() == 0:
                raise ValueError(f"sparse_mla: row {t} selects no token")
            latents = gather_paged_tokens(latent_cache, block_tables[i], selected, latent_scale)
            q_lat = absorb_query(q_nope[t : t + 1], w_uk)
            o_lat = latent_attention(
                q_lat, q_rope[t : t + 1], latents.to(q_nope.dtype), None, scale
            )
            out[t : t + 1] = project_values(o_lat, w_uv)
    return out
