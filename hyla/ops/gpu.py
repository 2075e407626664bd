"""Where a CUDA tensor goes: the Triton kernels of `hyla/ops/<op>/kernels.py` when triton
imports, else the PyTorch reference (which runs on any device, only slower)."""

from __future__ import annotations

import functools
import importlib.util

import torch


@functools.cache
def triton_available() -> bool:
    """True when the `triton` package is installed (checked once per process, not imported)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(x: torch.Tensor) -> bool:
    """True when `x` is a CUDA tensor and triton is installed."""
    return x.is_cuda and triton_available()
