"""Rotary position embedding: frequencies (default, linear, YaRN), cos/sin, apply. See
`reference.py`."""

from hyla.ops.rotary.reference import (
    apply_rope,
    rope_cos_sin,
    rope_inv_freq,
    rope_softmax_mscale,
)

__all__ = ["apply_rope", "rope_cos_sin", "rope_inv_freq", "rope_softmax_mscale"]
