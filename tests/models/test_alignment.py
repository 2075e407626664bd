"""Precision alignment: hyla vs the `transformers` reference implementation, per family.

Oracle: the `transformers` model of the same family, same weights, fp32, eager attention, on its
PyTorch path. hyla loads the saved checkpoint through its own loader and runs its own paged
cache and state-slot handling (SequenceRunner: shuffled blocks, NaN-poisoned caches).

Tolerances (fp32): prefill logits max abs error <= 1e-4; 32 greedy steps give identical ids.
"""

from __future__ import annotations

import pytest
import torch

from hyla.models.loader import load_model
from tests.hf_tiny import FAMILIES, save_tiny_hf_model
from tests.models.parity import assert_greedy_matches_generate, assert_prefill_matches

PROMPT_LENS = (1, 2, 63, 64, 65, 200)
LOGIT_ATOL = 1e-4
NUM_GREEDY = 32


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_hf_model(request.param, path, seed=0)
    return request.param, hf, load_model(path, dtype="float32")


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_prefill_logits_match_transformers(pair):
    family, hf, model = pair
    assert_prefill_matches(hf, model, _prompts(model.config.vocab_size), LOGIT_ATOL, family)


def test_greedy_decode_matches_transformers_generate(pair):
    family, hf, model = pair
    assert_greedy_matches_generate(hf, model, _prompts(model.config.vocab_size), NUM_GREEDY, family)
