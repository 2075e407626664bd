"""Triton `reference.greedy_logprobs`: one online-softmax pass per row (Milakov & Gimelshein 2018);
matches the reference up to the order of the fp32 sum (a few ulp)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _greedy_kernel(x_ptr, tok_ptr, lp_ptr, V, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    big = 2147483647
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    idx = tl.full([], 0, tl.int32)
    nan_idx = tl.full([], big, tl.int32)
    for v0 in range(0, V, BLOCK):
        cols = v0 + offs
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < V, other=float("-inf"))
        nan_idx = tl.minimum(nan_idx, tl.min(tl.where(x != x, cols, big), axis=0))
        x = tl.where(x != x, float("-inf"), x)
        cm = tl.max(x, axis=0)
        first = tl.min(tl.where(x == cm, cols, big), axis=0)
        idx = tl.where((cm > m) | ((v0 == 0) & (cm == m)), first, idx)
        new_m = tl.maximum(m, cm)
        scale = tl.where(m == new_m, 1.0, tl.exp(m - new_m))
        e = tl.where(x == float("-inf"), 0.0, tl.exp(x - new_m))
        s = s * scale + tl.sum(e, axis=0)
        m = new_m
    lp = -tl.log(s)
    lp = tl.where((nan_idx < big) | (m == float("-inf")), float("nan"), lp)  # as log_softmax
    tl.store(tok_ptr + row, tl.where(nan_idx < big, nan_idx, idx).to(tl.int64))
    tl.store(lp_ptr + row, lp)


def greedy_logprobs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] float32, unit stride along V -> (tokens [n] int64, logprobs [n] float32)."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.shape[1] == 0:
        raise ValueError(f"logits: need [n, V >= 1] float32, got {tuple(logits.shape)} "
                         f"{logits.dtype}")  # fmt: skip
    if logits.stride(1) != 1:
        raise ValueError("logits: need a unit stride along the vocabulary")
    n, vocab = logits.shape
    tokens = torch.empty(n, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n:
        _greedy_kernel[(n,)](logits, tokens, logprobs, vocab, logits.stride(0), BLOCK=BLOCK)
    return tokens, logprobs
