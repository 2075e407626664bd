"""Whether a tensor can take the Triton kernels of `hyla/ops/<op>/kernels.py`."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and triton_available()


def triton_runs_on(x: torch.Tensor) -> bool:
    """`use_triton`, or any tensor under TRITON_INTERPRET=1 (the interpreter tests)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and triton_available()
    return use_triton(x) or interpreted


def needs_grad(*tensors: torch.Tensor) -> bool:
    """True when autograd would record an op (the Triton kernels have no backward)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def index_tensor(
    values: list, device: torch.device | str, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """`values` as a tensor on `device` via pinned memory (pageable copies drain the stream)."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
