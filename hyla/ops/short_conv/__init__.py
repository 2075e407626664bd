"""Short causal depthwise convolution with a carried state. See `reference.py` for the
definition; the public function is the vectorized one of `cpu.py`, tested against it. The
decode step on a slot pool has a Triton kernel (`kernels.conv_update_slots`), imported on
first use where `slot_kernel_runs_on` says it runs, so CPU installs never import triton."""

from __future__ import annotations

import os

import torch

from hyla.ops.gpu import triton_available, use_triton
from hyla.ops.short_conv.cpu import causal_conv1d

__all__ = ["causal_conv1d", "slot_kernel_runs_on"]


def slot_kernel_runs_on(conv_pool: torch.Tensor) -> bool:
    """True when `kernels.conv_update_slots` should update `conv_pool`: a CUDA tensor with
    triton installed, or any tensor under TRITON_INTERPRET=1 (the interpreter tests)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and triton_available()
    return use_triton(conv_pool) or interpreted
