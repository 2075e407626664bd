"""Triton `write_paged`: negative slots (padding rows of a CUDA-graph batch) are skipped; values
are cast by torch first, so fp8 rounding is bit-identical to the reference."""

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
    """`reference.write_paged` in one launch; cache contiguous; a slot < 0 skips its token.
    Slots >= P * B are not checked (undefined)."""
    check_write_shapes(cache, slot_mapping, values)
    T = values.shape[0]
    if T == 0:
        return
    slot_mapping = slot_mapping.contiguous()
    E = cache[0, 0].numel()
    flat = _raw(cache).view(cache.shape[0] * cache.shape[1], E)
    rows = _raw(values.to(cache.dtype)).reshape(T, E).contiguous()
    block = min(BLOCK_E, triton.next_power_of_2(E))
    grid = (T, triton.cdiv(E, block))
    _write_paged_kernel[grid](
        flat, slot_mapping, rows, E, flat.stride(0), rows.stride(0), BLOCK=block, num_warps=4
    )
