"""Greedy token and logprob per row; CUDA logits take the Triton kernel (imported lazily)."""

from __future__ import annotations

import torch

from hyla.ops.gpu import use_triton
from hyla.ops.greedy import reference

__all__ = ["greedy_logprobs"]


def greedy_logprobs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] float32 -> (tokens [n] int64, logprobs [n] float32)."""
    if use_triton(logits) and logits.dim() == 2 and logits.stride(-1) == 1:
        from hyla.ops.greedy import kernels

        return kernels.greedy_logprobs(logits)
    return reference.greedy_logprobs(logits)
