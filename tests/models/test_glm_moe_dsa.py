"""GLM-5 (`glm_moe_dsa`): hyla vs transformers.

Oracle: transformers' `GlmMoeDsaForCausalLM` (fp32, eager) with the same random weights
(`tests.glm_moe_dsa_tiny`: 5 DSA layers, 3 of them "shared" (reusing the last full layer's
top-k), interleaved indexer rope, top-16), saved as a sharded checkpoint; hyla loads it and runs
its paged cache with shuffled blocks and NaN-poisoned caches (`SequenceRunner`). Prompts longer
than 16 tokens take the indexer's sparse path. Tolerance: prefill logits max abs error <= 1e-6
(fp32; measured ~2.4e-7; the neox indexer rope of DeepSeek-V3.2 is off by ~0.26 on the same
prompts); 24 greedy steps identical to `generate`, which crosses the top-k boundary. Engine
paths (scheduler, prefix caching) are in tests/engine/test_hybrid_families_engine.py.
"""

from __future__ import annotations

import pytest
import torch

from hyla.config import ConfigError
from hyla.models.loader import checkpoint_files, load_model
from hyla.models.registry import config_from_hf
from tests.glm_moe_dsa_tiny import INDEXER_TYPES, save_tiny_glm_moe_dsa, tiny_config
from tests.models.parity import (
    assert_chunked_equals_whole,
    assert_greedy_matches_generate,
    assert_prefill_matches,
)

PROMPT_LENS = (1, 3, 9, 16, 17, 40, 67)
LOGIT_ATOL = 1e-6


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm_moe_dsa")
    torch.set_num_threads(1)
    hf = save_tiny_glm_moe_dsa(path, seed=0, max_shard_size="100KB")
    assert len(checkpoint_files(path)) > 1  # sharded
    return hf, load_model(path, dtype="float32", progress=False)


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(4321)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_config_maps_shared_indexers_and_interleaved_rope(pair):
    _, model = pair
    cfg = model.config
    assert cfg.layer_pattern == ("dsa",) * 5 and cfg.ffn_pattern == ("dense",) + ("moe",) * 4
    assert cfg.dsa.indexer_types == tuple(INDEXER_TYPES)
    assert cfg.dsa.index_rope_style == "interleave"
    shared = [layer.mixer.indexer is None for layer in model.layers]
    assert shared == [t == "shared" for t in INDEXER_TYPES]


def test_prefill_logits_match_transformers(pair):
    hf, model = pair
    prompts = _prompts(model.config.vocab_size)
    assert_prefill_matches(hf, model, prompts, LOGIT_ATOL, "glm_moe_dsa", max_len=128,
                           block_size=8)  # fmt: skip


def test_greedy_decode_matches_transformers_generate(pair):
    hf, model = pair
    prompts = [p for p in _prompts(model.config.vocab_size) if len(p) in (3, 9, 40)]
    assert_greedy_matches_generate(hf, model, prompts, 24, "glm_moe_dsa", stop_at_eos=False,
                                   max_len=128, block_size=8)  # fmt: skip


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_prefill_equals_one_prefill(pair, chunk):
    """I1 split: a chunk's shared layers reuse that chunk's top-k."""
    _, model = pair
    assert_chunked_equals_whole(model, _prompts(model.config.vocab_size)[-1], chunk)


def test_index_topk_pattern_and_schedule_map_to_indexer_types():
    """transformers' own `indexer_types` (from a pattern or the freq/offset schedule) is the
    oracle for hyla's reading of the raw fields."""
    for extra in ({"index_topk_pattern": "FSFFS"}, {"index_topk_freq": 2,
                                                    "index_skip_topk_offset": 1}):  # fmt: skip
        hf = tiny_config(indexer_types=None, **extra)
        raw = {k: v for k, v in hf.to_dict().items() if k != "indexer_types"} | extra
        assert config_from_hf(raw).dsa.indexer_types == tuple(hf.indexer_types), extra


def test_a_shared_first_layer_is_refused():
    raw = tiny_config().to_dict() | {"indexer_types": ["shared", "full", "full", "full", "full"]}
    with pytest.raises(ConfigError, match=r"indexer_types\[0\]"):
        config_from_hf(raw)
