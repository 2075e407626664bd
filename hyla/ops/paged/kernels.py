"""Triton `write_paged`: scatter T new entries into a paged cache, negative slots skipped.

Same signature as `reference.write_paged`. One program per (token, tile of the entry); an entry
is the cache's trailing dims flattened (E elements). Values are cast to the cache dtype by
torch first (so fp8 rounding is torch's, bit-identical to the reference) and moved as raw
elements (fp8 as bytes). A slot < 0 is skipped: padding rows of a fixed-size (CUDA-graph)
batch write nothing. Imports triton at module level; `hyla.ops.paged` imports this module only
for CUDA tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.paged.reference import _raw, check_write_shapes

BLOCK_E = 1024


@triton.jit
def _write_paged_kernel(
    cache_ptr,
    slot_ptr,
    values_ptr,
    E,
    stride_slot,
    stride_values,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        cols = tile * BLOCK + tl.arange(0, BLOCK)
        mask = cols < E
        row = tl.load(values_ptr + t * stride_values + cols, mask=mask)
        tl.store(cache_ptr + slot * stride_slot + cols, row, mask=mask)


def supports(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> bool:
    """True for CUDA tensors on one device with a contiguous cache (the flat-slot layout)."""
    return (
        cache.is_cuda
        and slot_mapping.device == cache.device
        and values.device == cache.device
        and cache.is_contiguous()
    )


def write_paged(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    """Store `values[t]` at flat slot `slot_mapping[t]` of `cache`, in place (one launch).

    Args:
        cache: [P, B, ...] contiguous, any dtype (values are cast to it).
        slot_mapping: [T] int32/int64 flat slots (block_id * B + offset), distinct where >= 0;
            a negative slot skips its token (the reference requires all slots valid).
        values: [T, ...] matching cache's trailing dims.
    Raises: ValueError on a shape mismatch. Slots >= P * B are not checked (undefined).
    """
    check_write_shapes(cache, slot_mapping, values)
    T = values.shape[0]
    if T == 0:
        return
    slot_mapping = slot_mapping.contiguous()  # the kernel reads slot t at offset t
    E = cache[0, 0].numel()
    flat = _raw(cache).view(cache.shape[0] * cache.shape[1], E)  # [P * B, E]
    rows = _raw(values.to(cache.dtype)).reshape(T, E).contiguous()  # [T, E]
    block = min(BLOCK_E, triton.next_power_of_2(E))
    grid = (T, triton.cdiv(E, block))
    _write_paged_kernel[grid](
        flat, slot_mapping, rows, E, flat.stride(0), rows.stride(0), BLOCK=block, num_warps=4
    )
