"""Sparse MLA over the tokens the DSA indexer selected. See `reference.py`; CUDA tensors take
the Triton path in `kernels.py` (same signature; triton is imported only then)."""

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
    """MLA of each new token over its selected tokens: `reference.sparse_mla` (args, [T, H, Dv]
    result), dispatched to `kernels.sparse_mla` for CUDA tensors (which returns NaN rows instead
    of raising when a row selects no token). With `seq_lens` the selection is made safe first
    (`valid_topk_indices`: no duplicate, future or out-of-range entry is read) and a row left
    empty gets zeros on both paths. `latent_scale` [P, B] float32: per-token scales of an fp8
    latent cache (read as e4m3 and scaled on load), else None. `valid_selection`: the caller
    guarantees distinct positions within 0 .. the row's own (`kpool_indexer_topk` builds them
    so), so the kernel path skips `valid_topk_indices` (a sort per row); empty rows still get
    zeros. The result is the same either way."""
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
