"""Precision drift of a configuration against a reference, teacher-forced along its greedy tokens
(decode rows read the cache one by one): KL, argmax agreement, |log p_ref(y) - log p_other(y)|."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from hyla.models.hybrid import HybridModel
from hyla.models.runner import SequenceRunner


@dataclass(frozen=True)
class DriftStats:
    num_rows: int
    mean_kl: float
    p99_kl: float
    max_kl: float
    top1_agreement: float
    max_logprob_diff: float
    mean_logprob_diff: float

    def to_dict(self) -> dict:
        return asdict(self)


def _prefill(runner: SequenceRunner, prompt: list[int], chunk: int) -> list[torch.Tensor]:
    rows = []
    for start in range(0, len(prompt), chunk):
        logits = runner.step({0: prompt[start : start + chunk]}, all_logits=True)[0]
        rows.append(torch.log_softmax(logits.float(), dim=-1))
    return rows


@torch.no_grad()
def greedy_reference(
    model: HybridModel, prompt: list[int], num_new: int, chunk: int = 512
) -> tuple[torch.Tensor, list[int]]:
    """The reference run: (log-probs [P + num_new - 1, V] float32, its greedy tokens)."""
    runner = SequenceRunner(model, 1, len(prompt) + num_new + 1, poison=False)
    rows = _prefill(runner, prompt, chunk)
    tokens = [int(rows[-1][-1].argmax())]
    for _ in range(num_new - 1):
        logp = torch.log_softmax(runner.step({0: [tokens[-1]]})[0].float(), dim=-1)
        rows.append(logp[None])
        tokens.append(int(logp.argmax()))
    return torch.cat(rows), tokens


@torch.no_grad()
def forced_logprobs(
    model: HybridModel, prompt: list[int], tokens: list[int], chunk: int = 512
) -> torch.Tensor:
    """Log-probs [P + len(tokens) - 1, V] along prompt + tokens (decode steps for tokens)."""
    runner = SequenceRunner(model, 1, len(prompt) + len(tokens) + 1, poison=False)
    rows = _prefill(runner, prompt, chunk)
    for token in tokens[:-1]:
        rows.append(torch.log_softmax(runner.step({0: [token]})[0].float(), dim=-1)[None])
    return torch.cat(rows)


def drift(ref: torch.Tensor, other: torch.Tensor, next_tokens: torch.Tensor) -> DriftStats:
    """`other` against `ref` (log-probs [R, V]) at `next_tokens` [R] int64 (the reference's)."""
    kl = (ref.exp() * (ref - other)).sum(-1).clamp_min(0)
    agree = (ref.argmax(-1) == other.argmax(-1)).float().mean()
    picked = lambda lp: lp.gather(-1, next_tokens[:, None])[:, 0]  # noqa: E731
    diff = (picked(ref) - picked(other)).abs()
    return DriftStats(
        num_rows=int(ref.shape[0]),
        mean_kl=float(kl.mean()),
        p99_kl=float(torch.quantile(kl, 0.99)),
        max_kl=float(kl.max()),
        top1_agreement=float(agree),
        max_logprob_diff=float(diff.max()),
        mean_logprob_diff=float(diff.mean()),
    )


def next_tokens(prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The token each row of a run over prompt + tokens predicts: prompt[1:] + tokens."""
    return torch.tensor(prompt[1:] + tokens, dtype=torch.long)
