"""Short causal depthwise convolution with a carried state. See `reference.py`."""

from hyla.ops.short_conv.reference import causal_conv1d

__all__ = ["causal_conv1d"]
