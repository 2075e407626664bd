"""Short causal depthwise convolution with a carried state. See `reference.py` for the
definition; the public function is the vectorized one of `cpu.py`, tested against it."""

from hyla.ops.short_conv.cpu import causal_conv1d

__all__ = ["causal_conv1d"]
