"""DeepSeek-V4 (`deepseek_v4`): hyla's reference path vs transformers.

Oracle: transformers' `DeepseekV4ForCausalLM` (fp32, eager) with the same random weights
(`tests.deepseek_v4_tiny`: one sliding-window, one HCA and two CSA layers, hash-routed and
sqrt-softplus MoE, 3 mHC streams), saved in the released checkpoint's tensor names, sharded;
hyla loads it and runs its paged cache with shuffled blocks and NaN-poisoned caches
(`SequenceRunner`). Prompts up to 67 tokens: 16 CSA windows (the top-3 indexer bites), 8 HCA
windows, the sliding window of 6 passed many times. Tolerance: prefill logits max abs error
<= 1e-5 (fp32; measured 2.9e-6 on logits of std ~0.8: each attention layer is bit-identical to
transformers' on the same input, the MoE's oneDNN matmuls within 3e-8, and 4 layers of mHC
streams and the final norm amplify that; without oneDNN, see the reference-path test); 24
greedy steps identical to `generate` (transformers' own cache of
compressor windows and overlap state is the decode oracle).
"""

from __future__ import annotations

import pytest
import torch

from hyla.models.loader import checkpoint_files, load_model
from tests.deepseek_v4_tiny import LAYER_TYPES, save_tiny_deepseek_v4
from tests.models.parity import (
    assert_chunked_equals_whole,
    assert_greedy_matches_generate,
    assert_prefill_matches,
)

pytest.importorskip("transformers.models.deepseek_v4")
PROMPT_LENS = (1, 3, 4, 8, 9, 17, 40, 67)
LOGIT_ATOL = 1e-5


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek_v4")
    torch.set_num_threads(1)
    hf = save_tiny_deepseek_v4(path, seed=0, max_shard_size="100KB")
    assert len(checkpoint_files(path)) > 1  # sharded
    return hf, load_model(path, dtype="float32", progress=False)


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(777)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_config_maps_layer_kinds_routing_and_streams(pair):
    hf, model = pair
    cfg = model.config
    kinds = {"sliding_attention": "swa", "compressed_sparse_attention": "csa",
             "heavily_compressed_attention": "hca"}  # fmt: skip
    assert cfg.layer_pattern == tuple(kinds[t] for t in LAYER_TYPES)
    assert cfg.ffn_pattern == ("hash_moe", "moe", "moe", "moe")
    assert cfg.moe.scoring == "sqrt_softplus" and cfg.hc_mult == 3 and cfg.hc_head_weighted
    c = cfg.compressed
    assert (c.csa_ratio, c.hca_ratio, c.sliding_window, c.index_topk) == (4, 8, 6, 3)
    assert torch.equal(model.layers[0].mlp.gate.tid2eid, hf.model.layers[0].mlp.gate.tid2eid)


def test_prefill_logits_match_transformers(pair):
    hf, model = pair
    assert_prefill_matches(hf, model, _prompts(model.config.vocab_size), LOGIT_ATOL,
                           "deepseek_v4", max_len=128, block_size=8)  # fmt: skip


def test_reference_path_prefill_logits_match_transformers_to_1e6(pair, monkeypatch):
    """Each prompt alone (as transformers runs it) with the CPU's oneDNN fast path off
    (`hyla.ops.linear.cpu.ONEDNN`: another summation order than transformers' MKL matmuls,
    ~3e-8 a layer that the mHC streams amplify): every op is the one transformers runs, on
    the same shapes, so MKL rounds alike; measured 0 for 7 of the 8 lengths, 9.2e-7 for one.
    (In one batch of all prompts MKL rounds by the batch's row count: ~2e-6.)"""
    import hyla.ops.linear.cpu as linear_cpu

    hf, model = pair
    monkeypatch.setattr(linear_cpu, "ONEDNN", False)
    for prompt in _prompts(model.config.vocab_size):
        assert_prefill_matches(hf, model, [prompt], 1e-6, "deepseek_v4 (reference path)",
                               max_len=128, block_size=8)  # fmt: skip


def test_greedy_decode_matches_transformers_generate(pair):
    hf, model = pair
    prompts = [p for p in _prompts(model.config.vocab_size) if len(p) in (3, 9, 40)]
    assert_greedy_matches_generate(hf, model, prompts, 24, "deepseek_v4", stop_at_eos=False,
                                   max_len=128, block_size=8)  # fmt: skip


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_chunked_prefill_equals_one_prefill(pair, chunk):
    """I1 split: windows cut across chunks pool the same entries."""
    _, model = pair
    assert_chunked_equals_whole(model, _prompts(model.config.vocab_size)[-1], chunk)
