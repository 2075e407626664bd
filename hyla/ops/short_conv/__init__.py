"""Short causal depthwise convolution with a carried state (definition: `reference.py`). The
Triton slot-pool kernels are imported only where they run, so CPU installs never import triton."""

from __future__ import annotations

from hyla.ops.short_conv.cpu import causal_conv1d, conv_boundary_rows, conv_states_gather
from hyla.ops.short_conv.reference import conv_states_at

__all__ = ["causal_conv1d", "conv_boundary_rows", "conv_states_at", "conv_states_gather"]
