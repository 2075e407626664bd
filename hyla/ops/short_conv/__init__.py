"""Short causal depthwise convolution with a carried state. See `reference.py` for the
definition; the public function is the vectorized one of `cpu.py`, tested against it. The
decode step on a slot pool has a Triton kernel (`kernels.conv_update_slots`), imported on
first use where `hyla.ops.gpu.triton_runs_on` says it runs, so CPU installs never import
triton."""

from __future__ import annotations

from hyla.ops.short_conv.cpu import causal_conv1d, conv_boundary_rows, conv_states_gather
from hyla.ops.short_conv.reference import conv_states_at

__all__ = ["causal_conv1d", "conv_boundary_rows", "conv_states_at", "conv_states_gather"]
