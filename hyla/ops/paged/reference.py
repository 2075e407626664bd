"""Paged per-token cache of `[P, B, ...]` (P blocks of B tokens): token j of a sequence lives
at flat slot `block_table[j // B] * B + j % B` of the [P * B, ...] view."""

from __future__ import annotations

import torch

from hyla.ops.fp8.reference import dequantize_per_token, quantize_per_token


def _flat(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])


def _raw(t: torch.Tensor) -> torch.Tensor:
    # CPU index_copy_/index_select have no fp8 kernels; move fp8 entries as bytes.
    return t.view(torch.uint8) if t.dtype.itemsize == 1 and t.dtype.is_floating_point else t


def check_write_shapes(
    cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor
) -> None:
    if values.shape[1:] != cache.shape[2:] or values.shape[0] != slot_mapping.shape[0]:
        raise ValueError(
            f"write_paged: values {tuple(values.shape)} / slot_mapping "
            f"{tuple(slot_mapping.shape)} do not fit cache {tuple(cache.shape)}"
        )


def write_paged(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    """Store `values[t]` ([T, ...], cast to cache's dtype) at flat slot `slot_mapping[t]`
    (distinct) of `cache` [P, B, ...], in place. Raises ValueError on a shape mismatch."""
    check_write_shapes(cache, slot_mapping, values)
    _raw(_flat(cache)).index_copy_(0, slot_mapping.long(), _raw(values.to(cache.dtype)))


def write_paged_entries(
    layer_cache: dict[str, torch.Tensor],
    name: str,
    slot_mapping: torch.Tensor,
    values: torch.Tensor,
    write=None,
) -> None:
    """Store `values` in `layer_cache[name]`; as e4m3 plus per-vector scales when the layer
    keeps `name + "_scale"` (an fp8 cache)."""
    write = write or write_paged
    scale_cache = layer_cache.get(name + "_scale")
    if scale_cache is None:
        write(layer_cache[name], slot_mapping, values)
        return
    q, scale = quantize_per_token(values)
    write(layer_cache[name], slot_mapping, q)
    write(scale_cache, slot_mapping, scale)


def dequantized(rows: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """`rows`, or fp8 rows times their per-vector scales (fp32) when `scales` is given."""
    return rows if scales is None else dequantize_per_token(rows, scales)


def token_slots(
    block_table: torch.Tensor, token_indices: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Flat cache slots [...] of `token_indices` [...] of one sequence."""
    idx = token_indices.long()
    blocks = block_table.long()[idx // block_size]
    return blocks * block_size + idx % block_size


def gather_paged(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    length: int,
    scale_cache: torch.Tensor | None = None,
) -> torch.Tensor:
    """A sequence's first `length` entries [length, ...] (fp32 dequantized with scale_cache).
    Raises ValueError when the block table is too short."""
    block_size = cache.shape[1]
    if length > block_table.shape[0] * block_size:
        raise ValueError(f"gather_paged: {block_table.shape[0]} blocks cannot hold {length} tokens")
    positions = torch.arange(length, device=cache.device)
    slots = token_slots(block_table, positions, block_size)
    rows = _raw(_flat(cache)).index_select(0, slots).view(cache.dtype)
    return dequantized(rows, None if scale_cache is None else _flat(scale_cache)[slots])


def gather_paged_tokens(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    scale_cache: torch.Tensor | None = None,
) -> torch.Tensor:
    """Entries [k, ...] of selected tokens [k] of one sequence (only their slots are read)."""
    slots = token_slots(block_table, token_indices, cache.shape[1]).reshape(-1)
    rows = _raw(_flat(cache)).index_select(0, slots).view(cache.dtype)
    rows = dequantized(rows, None if scale_cache is None else _flat(scale_cache)[slots])
    return rows.view(*token_indices.shape, *cache.shape[2:])


def gather_paged_padded(
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    scale_cache: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's entries padded to the longest: (entries [N, L, ...], valid [N, L]);
    padding holds garbage, callers mask it. Raises ValueError when the tables are too short."""
    N, block_size = len(seq_lens), cache.shape[1]
    longest = max(seq_lens, default=0)
    if longest > block_tables.shape[1] * block_size:
        raise ValueError(f"gather_paged_padded: {block_tables.shape[1]} blocks < {longest} tokens")
    positions = torch.arange(longest, device=cache.device)
    slots = block_tables.long()[:, positions // block_size] * block_size + positions % block_size
    rows = _raw(_flat(cache)).index_select(0, slots.reshape(-1)).view(cache.dtype)
    rows = dequantized(rows, None if scale_cache is None else _flat(scale_cache)[slots.reshape(-1)])
    lens = torch.tensor(seq_lens, dtype=torch.long, device=cache.device).reshape(N, 1)
    return rows.view(N, longest, *cache.shape[2:]), positions[None, :] < lens
