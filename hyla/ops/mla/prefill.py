"""MLA prefill in the expanded form: context latents gathered into a paged workspace, expanded by
kv_b_proj and attended by the tiled GQA kernel (shared keys, 192/128-wide dots instead of 576). A
sequence whose workspace alone exceeds `workspace_bytes` takes `mla_paged`."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from hyla.ops.gpu import needs_grad, use_triton
from hyla.ops.mla.paged import mla_paged
from hyla.ops.mla.reference import expand_latents, mla_expanded
from hyla.ops.paged import dequantized

WORKSPACE_BYTES = 1 << 30  # 1.5B model (H=16): ~100K context tokens at once


def mla_prefill(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    query_lens: Sequence[int] | None = None,
    latent_scale: torch.Tensor | None = None,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> torch.Tensor:
    """`reference.mla_expanded`, by `mla_prefill_flash` for CUDA tensors."""
    args = (q_nope, q_rope, latent_cache, block_tables, cu_seqlens, seq_lens, kv_b_weight, scale)
    if use_triton(q_nope) and not needs_grad(q_nope, q_rope, kv_b_weight):
        return mla_prefill_flash(
            *args, query_lens=query_lens, latent_scale=latent_scale,
            workspace_bytes=workspace_bytes,
        )  # fmt: skip
    return mla_expanded(*args, latent_scale=latent_scale)


def mla_prefill_flash(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: Sequence[int],
    kv_b_weight: torch.Tensor,
    scale: float,
    *,
    query_lens: Sequence[int] | None = None,
    latent_scale: torch.Tensor | None = None,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> torch.Tensor:
    """`mla_prefill` through the Triton GQA kernel (CUDA, or CPU under TRITON_INTERPRET=1)."""
    num_heads, dn = q_nope.shape[1], q_nope.shape[2]
    dv = kv_b_weight.shape[0] // num_heads - dn
    q = torch.cat([q_nope, q_rope], dim=-1)
    seq_lens = list(seq_lens)
    page = latent_cache.shape[1]
    per_token = workspace_token_bytes(latent_cache.shape[-1], kv_b_weight.shape[-1], num_heads,
                                      dn, dv, q.element_size())  # fmt: skip
    groups = plan_groups(seq_lens, page, per_token, workspace_bytes)
    attend = {True: _attend_expanded, False: _attend_paged}
    if not groups:
        return q.new_empty(0, num_heads, dv)
    if len(groups) == 1:
        return attend[groups[0][2]](q, latent_cache, block_tables, cu_seqlens, seq_lens,
                                    kv_b_weight, dn, scale, latent_scale)  # fmt: skip
    cu = list(accumulate(query_lens, initial=0)) if query_lens is not None else cu_seqlens.tolist()
    out = q.new_empty(q.shape[0], num_heads, dv)
    for start, end, expanded in groups:
        rows = slice(cu[start], cu[end])
        out[rows] = attend[expanded](
            q[rows], latent_cache, block_tables[start:end],
            cu_seqlens[start : end + 1] - cu_seqlens[start], seq_lens[start:end],
            kv_b_weight, dn, scale, latent_scale,
        )  # fmt: skip
    return out


def workspace_token_bytes(
    latent_dim: int, rank: int, num_heads: int, dn: int, dv: int, itemsize: int
) -> int:
    """Bytes of the expanded form per context token."""
    dr = latent_dim - rank
    return latent_dim * (itemsize + 4) + num_heads * (2 * dn + dv + dr) * itemsize


def plan_groups(
    seq_lens: Sequence[int], page: int, token_bytes: int, workspace_bytes: int
) -> list[tuple[int, int, bool]]:
    """Consecutive (start, end, expanded) ranges whose workspace fits; a misfit alone is not
    expanded."""
    groups: list[tuple[int, int, bool]] = []
    used = 0
    for i, n in enumerate(seq_lens):
        need = -(-n // page) * page * token_bytes
        fits = need <= workspace_bytes
        last = groups[-1] if groups else None
        if last is not None and last[2] and fits and used + need <= workspace_bytes:
            groups[-1], used = (last[0], i + 1, True), used + need
        else:
            groups.append((i, i + 1, fits))
            used = need
    return groups


def _attend_expanded(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: list[int],
    kv_b_weight: torch.Tensor,
    dn: int,
    scale: float,
    latent_scale: torch.Tensor | None,
) -> torch.Tensor:
    from hyla.ops.gqa import kernels as gqa_kernels

    num_heads, page = q.shape[1], latent_cache.shape[1]
    blocks, table = _workspace_layout(block_tables, seq_lens, page)
    raw = latent_cache.view(torch.uint8) if latent_cache.element_size() == 1 else latent_cache
    rows = raw.index_select(0, blocks).view(latent_cache.dtype)
    scales = None if latent_scale is None else latent_scale.index_select(0, blocks)
    latents = dequantized(rows, scales).to(q.dtype).flatten(0, 1)
    k, v = expand_latents(latents, kv_b_weight, num_heads, dn)
    k, v = k.unflatten(0, (-1, page)), v.unflatten(0, (-1, page))
    lens = to_device(torch.tensor(seq_lens, dtype=torch.int32), q.device)
    return gqa_kernels.paged_gqa(q, k, v, table, cu_seqlens, lens, scale)


def _workspace_layout(
    block_tables: torch.Tensor, seq_lens: list[int], page: int
) -> tuple[torch.Tensor, torch.Tensor]:
    device = block_tables.device
    pages = torch.tensor([-(-n // page) for n in seq_lens])
    first = pages.cumsum(0) - pages
    seq = torch.repeat_interleave(torch.arange(len(seq_lens)), pages)
    col = torch.arange(int(pages.sum())) - first[seq]
    width = max(int(pages.max()), 1)
    table = (first[:, None] + torch.arange(width)).clamp(max=max(int(pages.sum()) - 1, 0))
    blocks = block_tables[to_device(seq, device), to_device(col, device)].long()
    return blocks, to_device(table.to(torch.int32), device)


def _attend_paged(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: list[int],
    kv_b_weight: torch.Tensor,
    dn: int,
    scale: float,
    latent_scale: torch.Tensor | None,
) -> torch.Tensor:
    lens = to_device(torch.tensor(seq_lens, dtype=torch.int32), q.device)
    return mla_paged(
        q[..., :dn], q[..., dn:], latent_cache, block_tables, cu_seqlens, lens, max(seq_lens),
        kv_b_weight, scale, latent_scale=latent_scale,
    )  # fmt: skip


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy from pinned memory: a pageable copy would make the host wait for queued work."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
