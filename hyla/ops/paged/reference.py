"""Paged per-token cache: write new tokens' entries, read a sequence's entries back.

A cache tensor is `[P, B, ...]` (P blocks of B tokens). Token j of a sequence lives at

    block_table[j // B] * B + j % B        (its flat slot in the [P * B, ...] view)

    block_table = [7, 2, 9]   B = 4
    token j:      0 1 2 3 | 4 5 6 7 | 8 9 ...
    slot:        28 ... 31| 8 ... 11|36 37 ...
"""

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
    """Raise ValueError unless `values` [T, ...] and `slot_mapping` [T] fit `cache` [P, B, ...]."""
    if values.shape[1:] != cache.shape[2:] or values.shape[0] != slot_mapping.shape[0]:
        raise ValueError(
            f"write_paged: values {tuple(values.shape)} / slot_mapping "
            f"{tuple(slot_mapping.shape)} do not fit cache {tuple(cache.shape)}"
        )


def write_paged(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    """Store `values[t]` at flat slot `slot_mapping[t]` of `cache`, in place.

    Args:
        cache: [P, B, ...] any dtype (values are cast to it).
        slot_mapping: [T] int64 flat slots (block_id * B + offset), all distinct.
        values: [T, ...] matching cache's trailing dims.
    Raises: ValueError on a shape mismatch.
    """
    check_write_shapes(cache, slot_mapping, values)
    _raw(_flat(cache)).index_copy_(0, slot_mapping.long(), _raw(values.to(cache.dtype)))


def write_paged_entries(
    layer_cache: dict[str, torch.Tensor],
    name: str,
    slot_mapping: torch.Tensor,
    values: torch.Tensor,
    write=None,
) -> None:
    """Store `values` [T, ...] in `layer_cache[name]` at `slot_mapping`; when the layer keeps
    `name + "_scale"` (an fp8 cache, `hyla.cache.spec`), as e4m3 with one float32 scale per
    vector of the last dim (`hyla.ops.fp8.quantize_per_token`). `write`: the writer of one
    tensor (default `write_paged`)."""
    write = write or write_paged
    scale_cache = layer_cache.get(name + "_scale")
    if scale_cache is None:
        write(layer_cache[name], slot_mapping, values)
        return
    q, scale = quantize_per_token(values)
    write(layer_cache[name], slot_mapping, q)
    write(scale_cache, slot_mapping, scale)


def dequantized(rows: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """Gathered cache rows as read: `rows` itself, or fp8 rows times their per-vector scales
    (float32) when `scales` (gathered alike, rows' shape without the last dim) is given."""
    return rows if scales is None else dequantize_per_token(rows, scales)


def token_slots(
    block_table: torch.Tensor, token_indices: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Flat cache slots of a sequence's tokens.

    Args:
        block_table: [max_blocks] int32 block ids of one sequence.
        token_indices: [...] int64 token indices within the sequence (all >= 0).
        block_size: B.
    Returns: [...] int64 flat slots.
    """
    idx = token_indices.long()
    blocks = block_table.long()[idx // block_size]
    return blocks * block_size + idx % block_size


def gather_paged(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    length: int,
    scale_cache: torch.Tensor | None = None,
) -> torch.Tensor:
    """A sequence's first `length` entries, in token order.

    Args:
        cache: [P, B, ...].
        block_table: [max_blocks] int32 block ids of the sequence.
        length: tokens to read (<= max_blocks * B).
        scale_cache: [P, B, ...] without cache's last dim: per-vector scales of an fp8 cache.
    Returns: [length, ...] in cache's dtype (a copy); float32, dequantized, with scale_cache.
    Raises: ValueError when the block table is too short for `length`.
    """
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
    """Entries of selected tokens of one sequence (sparse read: only these slots are touched).

    Args:
        cache: [P, B, ...].
        block_table: [max_blocks] int32 block ids of the sequence.
        token_indices: [k] int64 token indices within the sequence (all >= 0).
        scale_cache: per-vector scales of an fp8 cache (see `gather_paged`).
    Returns: [k, ...] in cache's dtype (float32, dequantized, with scale_cache).
    """
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
    """Every sequence's entries at once, padded to the longest (`gather_paged` per row).

    Args:
        cache: [P, B, ...].
        block_tables: [N, max_blocks] int32, rows padded with any valid block id.
        seq_lens: N host ints, entries to read per sequence (<= max_blocks * B).
        scale_cache: per-vector scales of an fp8 cache (see `gather_paged`).
    Returns: (entries [N, L, ...] in cache's dtype (float32, dequantized, with scale_cache)
        with L = max(seq_lens), valid [N, L] bool).
        Padding entries (valid False) hold whatever the padded block ids point at: callers
        mask them.
    Raises: ValueError when the block tables are too short.
    """
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
