"""Paged causal grouped-query attention over a packed varlen batch. See `reference.py`;
`bounded.py` is the same attention with the lengths on the device (captured decode steps)."""

from hyla.ops.gqa.bounded import paged_gqa_bounded
from hyla.ops.gqa.reference import causal_mask, masked_attention, paged_gqa

__all__ = ["causal_mask", "masked_attention", "paged_gqa", "paged_gqa_bounded"]
