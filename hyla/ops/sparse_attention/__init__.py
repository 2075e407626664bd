"""Sparse MLA over the tokens the DSA indexer selected. See `reference.py`; CUDA tensors take
the Triton path in `kernels.py` (same signature; triton is imported only then)."""

from __future__ import annotations

import torch

from hyla.ops.gpu import use_triton
from hyla.ops.sparse_attention import reference


def sparse_mla(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    topk_indices: torch.Tensor,
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    latent_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """MLA of each new token over its selected tokens: `reference.sparse_mla` (args, [T, H, Dv]
    result), dispatched to `kernels.sparse_mla` for CUDA tensors (which returns NaN rows instead
    of raising when a row selects no token). `latent_scale` [P, B] float32: per-token scales
    of an fp8 latent cache (read as e4m3 and scaled on load), else None."""
    if use_triton(q_nope):
        from hyla.ops.sparse_attention import kernels

        return kernels.sparse_mla(
            q_nope, q_rope, latent_cache, block_tables, cu_seqlens, topk_indices, kv_b_weight,
            scale, latent_scale=latent_scale,
        )  # fmt: skip
    return reference.sparse_mla(
        q_nope,
        q_rope,
        latent_cache,
        block_tables,
        cu_seqlens,
        topk_indices,
        kv_b_weight,
        scale,
        latent_scale=latent_scale,
    )


__all__ = ["sparse_mla"]
