"""Where a CUDA tensor goes: the Triton kernels of `hyla/ops/<op>/kernels.py` when triton
imports, else the PyTorch reference (which runs on any device, only slower)."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def triton_available() -> bool:
    """True when the `triton` package is installed (checked once per process, not imported)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(x: torch.Tensor) -> bool:
    """True when `x` is a CUDA tensor and triton is installed."""
    return x.is_cuda and triton_available()


def triton_runs_on(x: torch.Tensor) -> bool:
    """True when a Triton kernel can take `x`: a CUDA tensor with triton installed, or any
    tensor under TRITON_INTERPRET=1 with triton installed (the interpreter tests)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and triton_available()
    return use_triton(x) or interpreted


def needs_grad(*tensors: torch.Tensor) -> bool:
    """True when autograd would record an op on `tensors` (the Triton kernels have no backward:
    such calls keep the PyTorch reference)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
