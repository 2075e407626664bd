"""One row of sampling, the definition the batched `hyla.engine.sampler` is tested against, in
Hugging Face's order: penalties, ban (min_tokens), then argmax or /T, top-k, top-p, min-p, draw.
"""

from __future__ import annotations

import torch

from hyla.request import SamplingParams


def apply_penalties(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_token_ids: list[int],
    output_token_ids: list[int],
) -> torch.Tensor:
    """Repetition (CTRL eq. 2, prompt + output), presence and frequency (OpenAI, output only)
    penalties of `logits: [V]` float32, as a new tensor."""
    p = params
    out = logits.clone()
    vocab = out.shape[0]
    if p.repetition_penalty != 1.0:
        seen = sorted({t for t in prompt_token_ids + output_token_ids if t < vocab})
        if seen:
            idx = torch.tensor(seen, dtype=torch.long, device=out.device)
            vals = out[idx]
            rp = p.repetition_penalty
            out[idx] = torch.where(vals > 0, vals / rp, vals * rp)
    if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and output_token_ids:
        ids = torch.tensor(output_token_ids, dtype=torch.long, device=out.device)
        counts = torch.bincount(ids[ids < vocab], minlength=vocab).to(out.dtype)
        out -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(out.dtype)
    return out


def banned_token_ids(
    params: SamplingParams, eos_token_ids: tuple[int, ...], num_output_tokens: int
) -> list[int]:
    if num_output_tokens >= params.min_tokens:
        return []
    eos = () if params.ignore_eos else eos_token_ids
    return sorted(set(eos) | set(params.stop_token_ids))


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Penalized `logits: [V]` float32 -> probs [V] after temperature, top-k, top-p, min-p."""
    x = logits / params.temperature
    vocab = x.shape[0]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = torch.softmax(x, dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """argmax(p / q), q ~ Exp(1) per token, picks token i with probability p_i."""
    q = torch.empty_like(probs).exponential_(generator=generator)
    return int(torch.argmax(probs / q))


def sample_row(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_token_ids: list[int],
    output_token_ids: list[int],
    eos_token_ids: tuple[int, ...] = (),
    generator: torch.Generator | None = None,
) -> int:
    x = apply_penalties(logits, params, prompt_token_ids, output_token_ids)
    banned = banned_token_ids(params, eos_token_ids, len(output_token_ids))
    banned = [b for b in banned if b < x.shape[0]]
    if banned:
        x[torch.tensor(banned, dtype=torch.long, device=x.device)] = float("-inf")
    if params.is_greedy:
        return int(torch.argmax(x))
    return draw(sampling_probs(x, params), generator)
