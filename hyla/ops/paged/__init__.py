"""Paged per-token cache reads and writes (`reference.py`); `write_paged` has a Triton kernel."""

from __future__ import annotations

import torch

from hyla.ops.gpu import use_triton
from hyla.ops.paged import reference
from hyla.ops.paged.reference import (
    dequantized,
    gather_paged,
    gather_paged_padded,
    gather_paged_tokens,
    token_slots,
)

__all__ = [
    "dequantized",
    "gather_paged",
    "gather_paged_padded",
    "gather_paged_tokens",
    "token_slots",
    "write_paged",
    "write_paged_entries",
]


def write_paged(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    """`reference.write_paged`; on CUDA slots < 0 are skipped."""
    if use_triton(cache):
        from hyla.ops.paged import kernels

        if kernels.supports(cache, slot_mapping, values):
            kernels.write_paged(cache, slot_mapping, values)
            return
    reference.write_paged(cache, slot_mapping, values)


def write_paged_entries(
    layer_cache: dict[str, torch.Tensor],
    name: str,
    slot_mapping: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """`reference.write_paged_entries` with this module's `write_paged`."""
    reference.write_paged_entries(layer_cache, name, slot_mapping, values, write_paged)
