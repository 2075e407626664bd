"""Paged causal grouped-query attention over a packed varlen batch. See `reference.py`."""

from hyla.ops.gqa.reference import causal_mask, masked_attention, paged_gqa

__all__ = ["causal_mask", "masked_attention", "paged_gqa"]
