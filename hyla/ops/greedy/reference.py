"""Greedy decoding's token and its logprob, the definition: for each row of logits,

    token   = argmax(x)                    (the first maximum; NaN counts as the maximum, as
                                            torch.argmax counts it)
    logprob = log_softmax(x)[token]        (= -log(sum_j exp(x_j - max x)))

as `hyla.engine.sampler` reports a plain greedy row (OpenAI's logprob: the model's raw
log-softmax).
"""

from __future__ import annotations

import torch


def greedy_logprobs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [n, V] float32 -> (tokens [n] int64, logprobs [n] float32).

    Raises: ValueError when logits is not 2-D float32 with V >= 1."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.shape[1] == 0:
        raise ValueError(f"logits: need [n, V >= 1] float32, got {tuple(logits.shape)} "
                         f"{logits.dtype}")  # fmt: skip
    tokens = torch.argmax(logits, dim=-1)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs
