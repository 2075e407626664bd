"""Qwen3.5-MoE (`qwen3_5_moe`) text model: hyla vs transformers.

Oracle: transformers' `Qwen3_5MoeForConditionalGeneration` (fp32, eager) with the same random
weights (`tests.qwen35_moe_tiny`: flat GDN with GVA, gated GQA with partial M-RoPE, softmax
top-2 MoE + gated shared expert in every layer), saved as a sharded checkpoint; hyla loads it
through its loader and runs its paged cache with shuffled blocks and NaN-poisoned caches
(`SequenceRunner`). Tolerance: prefill logits max abs error <= 1e-6 (fp32; measured ~2e-7);
32 greedy steps identical to `generate`. The engine paths (scheduler, prefix caching) are in
tests/engine/test_hybrid_families_engine.py, images in tests/multimodal.
"""

from __future__ import annotations

import pytest
import torch

from hyla.models.loader import checkpoint_files, load_model
from tests.models.parity import (
    assert_chunked_equals_whole,
    assert_greedy_matches_generate,
    assert_prefill_matches,
)
from tests.qwen35_moe_tiny import save_tiny_qwen35_moe

PROMPT_LENS = (1, 3, 4, 5, 9, 40, 67)
LOGIT_ATOL = 1e-6
NUM_GREEDY = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5_moe")
    torch.set_num_threads(1)
    hf = save_tiny_qwen35_moe(path, seed=0, max_shard_size="100KB")
    assert len(checkpoint_files(path)) > 1  # sharded
    return hf, load_model(path, dtype="float32", progress=False)


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_config_maps_the_text_model(pair):
    hf, model = pair
    cfg, text = model.config, hf.config.text_config
    assert cfg.layer_pattern == ("gdn", "gdn", "gdn", "gqa") and cfg.ffn_pattern == ("moe",) * 4
    assert cfg.linear.projection_layout == "flat" and cfg.norm_offset == 1.0
    moe = cfg.moe
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (
        text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size)  # fmt: skip
    assert moe.scoring == "softmax" and moe.norm_topk_prob and moe.shared_expert_gate
    assert moe.shared_intermediate_size == text.shared_expert_intermediate_size


def test_prefill_logits_match_transformers(pair):
    hf, model = pair
    prompts = _prompts(model.config.vocab_size)
    assert_prefill_matches(hf, model, prompts, LOGIT_ATOL, "qwen3_5_moe", max_len=128,
                           block_size=8)  # fmt: skip


def test_greedy_decode_matches_transformers_generate(pair):
    hf, model = pair
    prompts = [p for p in _prompts(model.config.vocab_size) if len(p) in (1, 5, 40)]
    assert_greedy_matches_generate(
        hf, model, prompts, NUM_GREEDY, "qwen3_5_moe", stop_at_eos=False, max_len=128,
        block_size=8,
    )  # fmt: skip


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_prefill_equals_one_prefill(pair, chunk):
    """I1 split: the GDN state and conv state carried across chunks."""
    _, model = pair
    assert_chunked_equals_whole(model, _prompts(model.config.vocab_size)[-1], chunk)


def test_text_only_config_maps_like_the_multimodal_one(pair):
    from hyla.models.registry import config_from_hf

    hf, model = pair
    text = dict(hf.config.text_config.to_dict(), model_type="qwen3_5_moe_text")
    flat, cfg = config_from_hf(text), model.config
    fields = ("layer_pattern", "ffn_pattern", "moe", "gqa", "linear", "rope", "hidden_size")
    assert [getattr(flat, n) for n in fields] == [getattr(cfg, n) for n in fields]
