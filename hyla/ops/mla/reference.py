"""Multi-head latent attention over the paged latent cache (DeepSeek-V2, arXiv 2405.04434,
section 2.1 and appendix C).

Each cached token holds one latent row `[c_kv (R) | k_rope (Dr)]`: the normed compressed KV and
the (roped, or for Kimi-Linear unrotated) key part shared by all heads. `kv_b_proj`'s weight
`[H * (Dn + Dv), R]` splits per head into W_UK `[Dn, R]` and W_UV `[Dv, R]`:

    expanded (prefill):  k_nope = c_kv W_UK^T, v = c_kv W_UV^T per head, then MHA with
                         q = [q_nope | q_rope], k = [k_nope | k_rope]
    absorbed (decode):   q_lat = q_nope W_UK (per head, [R]); score = q_lat.c_kv + q_rope.k_rope;
                         o_lat = softmax . c_kv; out = o_lat W_UV^T
Both are equal in exact arithmetic: q_nope . (W_UK c) = (q_nope W_UK) . c.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.gqa.reference import causal_mask, masked_attention
from hyla.ops.paged import gather_paged


def split_kv_b(
    kv_b_weight: torch.Tensor, num_heads: int, qk_nope_head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head up-projections from `kv_b_proj.weight` [H * (Dn + Dv), R].

    Returns: (w_uk [H, Dn, R], w_uv [H, Dv, R]) views.
    """
    w = kv_b_weight.view(num_heads, -1, kv_b_weight.shape[-1])
    return w[:, :qk_nope_head_dim], w[:, qk_nope_head_dim:]


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope [T, H, Dn], w_uk [H, Dn, R] -> q_lat [T, H, R] (query in latent space)."""
    return torch.einsum("thd,hdr->thr", q_nope, w_uk)


def project_values(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """o_lat [T, H, R], w_uv [H, Dv, R] -> [T, H, Dv] (latent output through W_UV)."""
    return torch.einsum("thr,hvr->thv", o_lat, w_uv)


def latent_attention(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    latents: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention in latent space (the absorbed form's core; also the sparse op's).

    Args:
        q_lat: [Tq, H, R]; q_rope: [Tq, H, Dr].
        latents: [S, R + Dr] rows `[c_kv | k_rope]`, in q's dtype.
        mask: [Tq, S] bool (True = attend) or None for all.
        scale: softmax scale.
    Returns: o_lat [Tq, H, R] in q's dtype; softmax in float32.
    """
    rank = q_lat.shape[-1]
    c_kv, k_rope = latents[:, :rank], latents[:, rank:]
    scores = torch.einsum("qhr,sr->hqs", q_lat, c_kv)
    scores = (scores + torch.einsum("qhd,sd->hqs", q_rope, k_rope)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q_lat.dtype)
    return torch.einsum("hqs,sr->qhr", probs, c_kv)


def expand_latents(
    latents: torch.Tensor, kv_b_weight: torch.Tensor, num_heads: int, dn: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """latents [S, R + Dr] -> (k [S, H, Dn + Dr] with k_rope shared by the heads, v [S, H, Dv]
    a strided view of the kv_b_proj output)."""
    rank = kv_b_weight.shape[-1]
    c_kv, k_rope = latents[:, :rank], latents[:, rank:]
    kv = (c_kv @ kv_b_weight.T).view(latents.shape[0], num_heads, -1)  # [S, H, Dn + Dv]
    k = torch.cat([kv[..., :dn], k_rope[:, None, :].expand(-1, num_heads, -1)], dim=-1)
    return k, kv[..., dn:]


def mla_expanded(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal MLA, expanded form: kv_b_proj applied to each sequence's gathered latents.

    Args:
        q_nope: [T, H, Dn]; q_rope: [T, H, Dr] (rope applied, or unrotated for NoPE MLA).
        latent_cache: [P, B, R + Dr].
        block_tables: [N, max_blocks] int32; cu_seqlens: [N + 1] int32.
        seq_lens: N host ints, cached tokens per sequence including this step's (written).
        kv_b_weight: [H * (Dn + Dv), R] (`kv_b_proj.weight`).
        scale: softmax scale.
        latent_scale: [P, B] float32 per-token scales of an fp8 latent cache, else None.
    Returns: [T, H, Dv] in q's dtype. Query row j of sequence i sits at position
        seq_lens[i] - q_i + j and attends to tokens 0 .. that position.
    """
    num_heads, dn = q_nope.shape[1], q_nope.shape[2]
    dv = kv_b_weight.shape[0] // num_heads - dn
    q = torch.cat([q_nope, q_rope], dim=-1)
    out = q.new_empty(q.shape[0], num_heads, dv)
    cu = cu_seqlens.tolist()
    for i, seq_len in enumerate(seq_lens):
        start, end = cu[i], cu[i + 1]
        if end == start:
            continue
        latents = gather_paged(latent_cache, block_tables[i], seq_len, latent_scale).to(q.dtype)
        k, v = expand_latents(latents, kv_b_weight, num_heads, dn)
        mask = causal_mask(end - start, seq_len, q.device)
        out[start:end] = masked_attention(q[start:end], k, v, mask, scale)
    return out


def mla_absorbed(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal MLA, absorbed form (W_UK folded into the query, W_UV applied after).

    Same arguments, causality and result as `mla_expanded`; cheaper when few queries read a long
    context (decode), since keys/values are never expanded per head.
    """
    num_heads, dn = q_nope.shape[1], q_nope.shape[2]
    w_uk, w_uv = split_kv_b(kv_b_weight, num_heads, dn)
    out = q_nope.new_empty(q_nope.shape[0], num_heads, w_uv.shape[1])
    cu = cu_seqlens.tolist()
    for i, seq_len in enumerate(seq_lens):
        start, end = cu[i], cu[i + 1]
        if end == start:
            continue
        latents = gather_paged(latent_cache, block_tables[i], seq_len, latent_scale)
        latents = latents.to(q_nope.dtype)
        mask = causal_mask(end - start, seq_len, q_nope.device)
        q_lat = absorb_query(q_nope[start:end], w_uk)  # [q_i, H, R]
        o_lat = latent_attention(q_lat, q_rope[start:end], latents, mask, scale)
        out[start:end] = project_values(o_lat, w_uv)
    return out
