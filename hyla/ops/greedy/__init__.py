"""Greedy decoding's token and logprob per row (`reference.py`, the definition); CUDA logits go
to the one-pass Triton kernel of `kernels.py` (imported on first use, so CPU installs never
import triton)."""

from __future__ import annotations

import torch

from hyla.ops.gpu import use_triton
from hyla.ops.greedy import reference

__all__ = ["greedy_logprobs"]


def greedy_logprobs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.greedy_logprobs`: logits [n, V] float32 -> (tokens [n] int64, logprobs [n]
    float32); errors as there."""
    if use_triton(logits) and logits.dim() == 2 and logits.stride(-1) == 1:
        from hyla.ops.greedy import kernels

        return kernels.greedy_logprobs(logits)
    return reference.greedy_logprobs(logits)
