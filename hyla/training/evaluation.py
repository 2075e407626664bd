"""Held-out bits per byte and retrieval accuracy (exact value, then a non-digit) of the default
model, via the inference path (`runner_logits`) or the faster, equal training forward."""

from __future__ import annotations

import random

import numpy as np
import torch

from hyla.models.hybrid import HybridModel
from hyla.models.runner import SequenceRunner
from hyla.training.corpus import RetrievalDocs
from hyla.training.forward import train_forward
from hyla.training.metrics import bits_per_byte


def retrieval_cases(
    tokenizer, tokens: np.ndarray, docs: list, eos_id: int, length: int, n: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """`n` seeded (prompt ids, answer ids) pairs with prompts of about `length` tokens."""
    maker = RetrievalDocs(tokenizer, tokens, docs, eos_id)
    rng = random.Random(seed * 1_000_003 + length)
    cases = []
    for _ in range(n):
        prompt, value = maker.eval_prompt(rng, length)
        cases.append((prompt, tokenizer.encode(" " + value, add_special_tokens=False).ids))
    return cases


def digit_start_mask(tokenizer) -> torch.Tensor:
    """[V] bool: tokens whose text starts with a digit."""
    vocab = tokenizer.get_vocab_size()
    return torch.tensor([tokenizer.decode([i])[:1].isdigit() for i in range(vocab)])


def retrieval_correct(
    logits: torch.Tensor, answer_ids: list[int], digit_start: torch.Tensor
) -> bool:
    """logits [len(answer) + 1, V]: row j predicts answer[j]; the last row the token after it."""
    predicted = logits.argmax(dim=-1).tolist()
    return predicted[:-1] == answer_ids and not bool(digit_start[predicted[-1]])


@torch.no_grad()
def batch_logits(model: HybridModel, ids: list[list[int]], chunk_size: int = 16) -> torch.Tensor:
    """Logits [M, T, V] float32 of M equal-length sequences via the training forward (end padding
    to `chunk_size` is invisible to real positions: causal)."""
    device = next(model.parameters()).device
    length = len(ids[0])
    pad = (-length) % chunk_size
    x = torch.tensor([row + [0] * pad for row in ids], device=device)
    on_gpu = device.type == "cuda"
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=on_gpu):
        hidden, _ = train_forward(model, x, sparse=True, chunk_size=chunk_size)
        return model.compute_logits(hidden[:, :length])


@torch.no_grad()
def runner_logits(
    model: HybridModel, prompt: list[int], tail: list[int], prefill_chunk: int = 2048
) -> torch.Tensor:
    """Logits [len(tail) + 1, V] for `tail` and the next token, after prefilling `prompt`."""
    runner = SequenceRunner(model, 1, len(prompt) + len(tail) + 1, poison=False)
    last = None
    for start in range(0, len(prompt), prefill_chunk):
        last = runner.step({0: prompt[start : start + prefill_chunk]})[0]
    rows = [last[None]]
    if tail:
        rows.append(runner.step({0: tail}, all_logits=True)[0])
    return torch.cat(rows)


def retrieval_accuracy(model, cases, digit_start, backend: str = "runner") -> float:
    hits = 0
    for prompt, answer in cases:
        if backend == "runner":
            logits = runner_logits(model, prompt, answer)
        else:
            logits = batch_logits(model, [prompt + answer])[0, len(prompt) - 1 :]
        hits += retrieval_correct(logits.cpu(), answer, digit_start)
    return hits / len(cases)


def heldout_bpb(
    model, windows: torch.Tensor, byte_lengths: torch.Tensor, backend: str, batch: int = 16
) -> float:
    """Bits per byte over windows [M, L + 1] (each a fresh sequence)."""
    bits = nbytes = 0
    rows = windows.tolist()
    step = batch if backend == "batch" else 1
    for i in range(0, len(rows), step):
        group = rows[i : i + step]
        if backend == "runner":
            logits = runner_logits(model, group[0][:1], group[0][1:-1])[None]
        else:
            logits = batch_logits(model, [r[:-1] for r in group])
        targets = torch.tensor([r[1:] for r in group])
        b, n = bits_per_byte(logits.cpu().flatten(0, 1), targets.flatten(), byte_lengths)
        bits, nbytes = bits + b, nbytes + n
    return bits / nbytes
