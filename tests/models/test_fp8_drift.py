"""FP8 drift on the embedded trained model, short form of bench/fp8_drift.py (which runs a 4K
prompt + 512 greedy tokens): fp8 weights, fp8 cache and both against the fp32 reference on the
same held-out tokens, within the bench's bounds relative to the bf16 model's own drift."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hyla.engine.loading import DEFAULT_MODEL_DIR, load_tokenizer
from hyla.models.drift import drift, forced_logprobs, greedy_reference, next_tokens
from hyla.models.loader import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from fp8_drift import BOUNDS, CONFIGS, check, heldout_prompt  # noqa: E402


def test_drift_stats_by_hand() -> None:
    ref = torch.log_softmax(torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]]), -1)
    other = torch.log_softmax(torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 3.0]]), -1)
    stats = drift(ref, other, torch.tensor([0, 1]))
    p = ref.exp()
    kl = [(p[i] * (ref[i] - other[i])).sum().item() for i in range(2)]
    assert stats.mean_kl == pytest.approx(sum(kl) / 2, rel=1e-6)
    assert stats.max_kl == pytest.approx(max(kl), rel=1e-6)
    assert stats.top1_agreement == 0.5  # row 1: argmax 1 vs 2
    diffs = [abs(ref[0, 0] - other[0, 0]).item(), abs(ref[1, 1] - other[1, 1]).item()]
    assert stats.max_logprob_diff == pytest.approx(max(diffs), rel=1e-6)
    assert drift(ref, ref, torch.tensor([0, 1])).max_kl == 0.0


@pytest.fixture(scope="module")
def reference():
    prompt = heldout_prompt(load_tokenizer(DEFAULT_MODEL_DIR), 256)
    model = load_model(DEFAULT_MODEL_DIR, "float32", progress=False)
    ref, tokens = greedy_reference(model, prompt, 16)
    return prompt, tokens, ref, next_tokens(prompt, tokens)


def _stats(reference, name: str) -> dict:
    prompt, tokens, ref, targets = reference
    model = load_model(DEFAULT_MODEL_DIR, progress=False, **CONFIGS[name])
    return drift(ref, forced_logprobs(model, prompt, tokens), targets).to_dict()


def test_forced_run_of_the_reference_is_exact(reference) -> None:
    prompt, tokens, ref, targets = reference
    assert ref.shape[0] == len(prompt) + len(tokens) - 1 == targets.shape[0]
    assert _stats(reference, "fp32")["max_kl"] < 1e-9


@pytest.fixture(scope="module")
def bf16(reference) -> dict:
    stats = _stats(reference, "bf16")
    assert stats["mean_kl"] > 0  # the yardstick measures something
    return stats


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_fp8_drift_within_bound(reference, bf16, name: str) -> None:
    stats = _stats(reference, name)
    assert stats["mean_kl"] > 0  # fp8 is in effect
    assert check(name, stats, bf16) == []
