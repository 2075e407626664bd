"""Dense causal MLA over the paged latent cache with the lengths on the device: every row of a
packed step (decode or prefill) attends to positions 0 .. its own position of its sequence.

    row t of sequence i (position p = seq_lens[i] - (cu_seqlens[i + 1] - t)) sees keys 0 .. p
    score = q_nope W_UK . c_kv + q_rope . k_rope        (absorbed form, DeepSeek-V2 appendix C)
    out   = softmax(scale * score) . c_kv  W_UV^T

Unlike `mla_absorbed_batched` (host `seq_lens`) nothing here depends on host values but
`max_seq_len`, a bound on the lengths: the op can be captured in a CUDA graph and replayed with
other lengths. CUDA tensors take the Triton kernel (`hyla.ops.mla.kernels`, the split-k kernel
of `hyla.ops.sparse_attention.kernels` walking positions instead of top-k indices); this file's
`mla_paged_reference` is its readable definition (tests/ops/test_mla_paged.py holds them and
`mla_absorbed_batched` together).
"""

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
    """Causal MLA of every packed row over its sequence's paged latents.

    Args:
        q_nope: [T, H, Dn]; q_rope: [T, H, Dr] (roped when the model ropes).
        latent_cache: [P, B, R + Dr] rows `[c_kv | k_rope]`, this step's rows written.
        block_tables: [N, max_blocks] int32 (at least ceil(max_seq_len / B) columns);
        cu_seqlens: [N + 1] int32.
        seq_lens: [N] int32 or int64 device tensor, cached tokens per sequence including this
            step's.
        max_seq_len: host int >= every seq_lens entry (sizes buffers and the split count only).
        kv_b_weight: [H * (Dn + Dv), R]; scale: softmax scale.
        rows: `hyla.ops.dsa_indexer.rows.row_positions(cu_seqlens, seq_lens, T)` when the caller
            already has it (shared by a pass's layers); computed here when None.
        latent_scale: [P, B] float32 per-token scales of an fp8 latent cache (the kernel reads
            the e4m3 rows and scales them as it loads them), else None.
    Returns: [T, H, Dv] in q's dtype; softmax in float32.
    """
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
    """`mla_paged` in PyTorch (any device): each row's keys gathered to [T, max_seq_len, R + Dr]
    and masked past its position; invisible slots may hold anything (NaN included)."""
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
    )  # [T, L, R + Dr], [T, L]
    latents = latents.to(q_nope.dtype).masked_fill(~visible[..., None], 0.0)
    query = torch.cat([absorb_query(q_nope, w_uk), q_rope], dim=-1)  # [T, H, R + Dr]
    scores = torch.einsum("thc,tlc->thl", query, latents) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q_nope.dtype)
    o_lat = torch.einsum("thl,tlr->thr", probs, latents[..., :rank])  # [T, H, R]
    return project_values(o_lat, w_uv)
