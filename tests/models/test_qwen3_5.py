"""Qwen3.5 (`qwen3_5`) text model: hyla vs transformers, and hyla's own invariants.

Oracle: transformers' `Qwen3_5ForConditionalGeneration` (fp32, eager) with the same random
weights (`tests.qwen35_tiny`: flat GDN projections with GVA, gated GQA with partial multimodal
RoPE); hyla loads the saved checkpoint through its loader and runs its paged cache with shuffled
blocks and NaN-poisoned caches (`SequenceRunner`). Tolerance: prefill logits max abs error
<= 1e-4 (fp32); 32 greedy steps identical to `generate`.
"""

from __future__ import annotations

import pytest
import torch

from hyla.models.loader import load_model
from tests.models.parity import (
    assert_chunked_equals_whole,
    assert_greedy_matches_generate,
    assert_prefill_matches,
)
from tests.qwen35_tiny import save_tiny_qwen35

PROMPT_LENS = (1, 3, 4, 5, 9, 40, 67)
LOGIT_ATOL = 1e-4
NUM_GREEDY = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5")
    torch.set_num_threads(1)
    hf = save_tiny_qwen35(path, seed=0)
    return hf, load_model(path, dtype="float32")


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_config_maps_the_text_model(pair):
    _, model = pair
    cfg = model.config
    assert cfg.layer_pattern == ("gdn", "gdn", "gdn", "gqa")
    assert cfg.linear.projection_layout == "flat" and cfg.norm_offset == 1.0
    assert cfg.rope.rotary_dim == 12 and cfg.ffn_pattern == ("dense",) * 4


def test_prefill_logits_match_transformers(pair):
    hf, model = pair
    prompts = _prompts(model.config.vocab_size)
    assert_prefill_matches(hf, model, prompts, LOGIT_ATOL, "qwen3_5", max_len=128, block_size=8)


def test_greedy_decode_matches_transformers_generate(pair):
    hf, model = pair
    prompts = [p for p in _prompts(model.config.vocab_size) if len(p) in (1, 5, 40)]
    assert_greedy_matches_generate(
        hf, model, prompts, NUM_GREEDY, "qwen3_5", stop_at_eos=False, max_len=128, block_size=8
    )


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 16])
def test_chunked_prefill_equals_one_prefill(pair, chunk):
    """I1 split: the GDN state and conv state carried across chunks."""
    _, model = pair
    assert_chunked_equals_whole(model, _prompts(model.config.vocab_size)[-1], chunk)  # 67 tokens
