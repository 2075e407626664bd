"""`hyla plan`'s cache and state bytes for GLM-5.3-Flash (`glm5_next`) against the engine's own
allocation and against hand arithmetic from the published architecture.

Oracles: the cache tensors an `LLM` of a tiny glm5_next checkpoint actually allocates (summed
`nbytes` of its paged tensors over the pool's tokens, and of its state slots), and for the
full-size default config (transformers' `Glm5NextConfig()`) the per-layer layout written out
here: 11 pooled-DSA layers, each a latent of kv_lora_rank 512 (no rope part) plus three pooled
indexer tensors (keys, gates, pooled keys) of index_head_dim 128.
"""

from __future__ import annotations

import pytest

from hyla.engine.llm import LLM
from hyla.models.registry import config_from_hf
from hyla.plan.costs import cache_bytes_per_token, state_bytes_per_seq
from hyla.plan.estimate import Workload
from hyla.plan.gpus import gpu_spec
from hyla.plan.planner import plan
from tests.glm_tiny import save_tiny_glm


@pytest.fixture(scope="module")
def tiny_glm(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm5_plan")
    save_tiny_glm(path, seed=0)
    return path


def _allocated(llm: LLM) -> tuple[float, int]:
    """(paged bytes per token, bytes per state slot) of the engine's cache tensors."""
    runner, plan_ = llm.engine.runner, llm.engine.cache_plan
    tokens = plan_.num_blocks * plan_.block_size
    paged = slots = 0
    for layer in runner.caches:
        for t in layer.values():
            if t.shape[:2] == (plan_.num_blocks, plan_.block_size):
                paged += t.nbytes
            else:
                slots += t.nbytes // t.shape[0]
    return paged / tokens, slots


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_tiny_glm_plan_equals_the_engines_allocation(tiny_glm, kv_cache_dtype):
    llm = LLM(str(tiny_glm), device="cpu", dtype="float32", kv_cache_dtype=kv_cache_dtype,
              max_model_len=256, max_num_seqs=2, enable_prefix_caching=False)  # fmt: skip
    per_token, per_slot = _allocated(llm)
    work = Workload(num_gpus=1, context=256, concurrency=1, weight_dtype="float32")
    kv = None if kv_cache_dtype == "auto" else kv_cache_dtype
    layout = plan(tiny_glm, gpu_spec("H200"), work, kv_cache_dtype=kv).layouts[0]
    assert layout.cache_bytes_per_token == per_token
    assert layout.state_bytes_per_seq == per_slot


def _glm_flash():
    from transformers import Glm5NextConfig

    raw = Glm5NextConfig().to_dict()
    raw["architectures"] = ["Glm5NextForConditionalGeneration"]
    return config_from_hf(raw).replace(dtype="bfloat16")


# 11 DSA layers; bf16: latent 512 x 2 B + 3 indexer tensors x 128 x 2 B. fp8: latent 512 x 1 B
# + its float32 scale (4 B); the pooled indexer tensors stay bf16 (no fp8 form for pooling).
HAND = {"auto": 11 * (512 * 2 + 3 * 128 * 2), "fp8": 11 * (512 + 4 + 3 * 128 * 2)}


@pytest.mark.parametrize("kv", list(HAND))
def test_glm_flash_cache_per_token_by_hand(kv):
    config = _glm_flash().replace(kv_cache_dtype=kv)
    assert cache_bytes_per_token(config) == HAND[kv]


def test_glm_flash_state_per_sequence_by_hand():
    """34 KDA layers x (64 heads x 128 x 128 fp32 state + q,k,v conv 3 x 8192 x (4 - 1) x 2 B)."""
    config = _glm_flash()
    assert config.layer_pattern.count("kda") == 34
    assert state_bytes_per_seq(config) == 34 * (64 * 128 * 128 * 4 + 3 * 8192 * 3 * 2)
