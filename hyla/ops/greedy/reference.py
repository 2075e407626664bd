"""Greedy token (first maximum; NaN counts as the maximum, as in torch.argmax) and its raw
log_softmax logprob, as `hyla.engine.sampler` reports a plain greedy row."""

from __future__ import annotations

import torch


def greedy_logprobs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [n, V] float32 -> (tokens [n] int64, logprobs [n] float32)."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.shape[1] == 0:
        raise ValueError(f"logits: need [n, V >= 1] float32, got {tuple(logits.shape)} "
                         f"{logits.dtype}")  # fmt: skip
    tokens = torch.argmax(logits, dim=-1)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs
