"""Rotary position embedding: frequencies (default, linear, YaRN), cos/sin, apply."""

from hyla.ops.rotary.pairs import apply_rope_pairs_tail
from hyla.ops.rotary.reference import (
    apply_rope,
    rope_cos_sin,
    rope_inv_freq,
    rope_softmax_mscale,
)

__all__ = [
    "apply_rope",
    "apply_rope_pairs_tail",
    "rope_cos_sin",
    "rope_inv_freq",
    "rope_softmax_mscale",
]
