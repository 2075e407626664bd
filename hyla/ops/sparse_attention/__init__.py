"""Sparse MLA over the tokens the DSA indexer selected."""

from __future__ import annotations

import torch

from hyla.ops.gpu import use_triton
from hyla.ops.sparse_attention import reference
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
    valid_selection: bool = False,
) -> torch.Tensor:
    """`reference.sparse_mla`, by `kernels.py` for CUDA tensors (NaN rows where the reference
    raises, unless `seq_lens` is given). valid_selection: positions are known distinct and causal
    (as `kpool_indexer_topk` builds them), which skips `valid_topk_indices`' sort."""
    if use_triton(q_nope):
        return kernel_sparse_mla(
            q_nope, q_rope, latent_cache, block_tables, cu_seqlens, topk_indices, kv_b_weight,
            scale, seq_lens, latent_scale=latent_scale, valid_selection=valid_selection,
        )  # fmt: skip
    return reference.sparse_mla(
        q_nope, q_rope, latent_cache, block_tables, cu_seqlens, topk_indices, kv_b_weight, scale,
        seq_lens, latent_scale=latent_scale,
    )  # fmt: skip


def kernel_sparse_mla(
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
    valid_selection: bool = False,
) -> torch.Tensor:
    """The Triton path of `sparse_mla` (also on CPU tensors under TRITON_INTERPRET)."""
    from hyla.ops.sparse_attention import kernels

    if seq_lens is not None and not valid_selection:
        topk_indices = valid_topk_indices(topk_indices, cu_seqlens, seq_lens)
    out = kernels.sparse_mla(
        q_nope, q_rope, latent_cache, block_tables, cu_seqlens, topk_indices, kv_b_weight, scale,
        latent_scale=latent_scale,
    )  # fmt: skip
    if seq_lens is None:
        return out
    return out.masked_fill(~(topk_indices >= 0).any(dim=1)[:, None, None], 0)


__all__ = ["kernel_sparse_mla", "sparse_mla", "valid_topk_indices"]
