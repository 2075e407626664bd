"""Multi-head latent attention over the paged latent cache (DeepSeek-V2, arXiv 2405.04434,
section 2.1 and appendix C); cache rows are [c_kv (R) | k_rope (Dr)]."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.gqa.reference import causal_mask, masked_attention
from hyla.ops.paged import gather_paged


def split_kv_b(
    kv_b_weight: torch.Tensor, num_heads: int, qk_nope_head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_uk [H, Dn, R], w_uv [H, Dv, R]) views of `kv_b_proj.weight`."""
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
    """q_lat: [Tq, H, R]; q_rope: [Tq, H, Dr]; latents: [S, R + Dr]; mask: [Tq, S] or None."""
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
    """latents [S, R + Dr] -> (k [S, H, Dn + Dr], v [S, H, Dv] a strided view)."""
    rank = kv_b_weight.shape[-1]
    c_kv, k_rope = latents[:, :rank], latents[:, rank:]
    kv = (c_kv @ kv_b_weight.T).view(latents.shape[0], num_heads, -1)
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
    """Causal MLA, expanded. q_nope: [T, H, Dn]; q_rope: [T, H, Dr]; latent_cache:
    [P, B, R + Dr]; seq_lens: N host ints including this step's; kv_b_weight: [H * (Dn + Dv), R];
    latent_scale: [P, B] per-token scales of an fp8 cache. Returns [T, H, Dv]; row j of sequence
    i sits at position seq_lens[i] - q_i + j."""
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
    """Causal MLA, absorbed (W_UK folded into q); as `mla_expanded`, cheaper for decode."""
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
        q_lat = absorb_query(q_nope[start:end], w_uk)
        o_lat = latent_attention(q_lat, q_rope[start:end], latents, mask, scale)
        out[start:end] = project_values(o_lat, w_uv)
    return out
