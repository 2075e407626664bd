"""Sparse MLA: each query attends only to the tokens its indexer selected (DeepSeek-V3.2-Exp
report, section 2.1), in the absorbed latent form (DeepSeek-V2 appendix C).

Only the selected tokens' latents are read: `topk_indices[t]` are token positions within t's
sequence, mapped to cache slots through that sequence's block table; -1 entries are skipped, so
an unwritten or recycled slot is never touched. Given `seq_lens`, the op first drops duplicate,
future and out-of-range entries itself (`indices.valid_topk_indices`) and a row left with no
token gets zeros (attention over an empty set).
"""

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
    """MLA of each new token over its selected tokens only.

    Args:
        q_nope: [T, H, Dn]; q_rope: [T, H, Dr].
        latent_cache: [P, B, R + Dr] rows `[c_kv | k_rope]`.
        block_tables: [N, max_blocks] int32; cu_seqlens: [N + 1] int32 (row t belongs to the
            sequence i with cu_seqlens[i] <= t < cu_seqlens[i + 1]).
        topk_indices: [T, k] int32 token positions within the row's sequence, -1 = none; each
            row needs at least one entry >= 0.
        kv_b_weight: [H * (Dn + Dv), R]; scale: softmax scale.
        seq_lens: [N] lengths including this step's tokens; given, entries that are repeated,
            in the row's future or outside the sequence are dropped, and an empty row is 0.
        latent_scale: [P, B] float32 per-token scales of an fp8 latent cache, else None.
    Returns: [T, H, Dv] in q's dtype.
    Raises: ValueError when a row selects no token (without `seq_lens`).
    """
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
            latents = gather_paged_tokens(
                latent_cache, block_tables[i], selected, latent_scale
            )  # [k', R+Dr]
            q_lat = absorb_query(q_nope[t : t + 1], w_uk)  # [1, H, R]
            o_lat = latent_attention(
                q_lat, q_rope[t : t + 1], latents.to(q_nope.dtype), None, scale
            )
            out[t : t + 1] = project_values(o_lat, w_uv)
    return out
