"""GLM-5.3-Flash (`glm5_next`) under tensor and expert parallelism on the CPU (gloo).

Oracle: the same tiny text-only checkpoint (`tests.glm_tiny`: KDA with the lower-bounded gate,
pooled DSA with a shared indexer layer, 3 hyper-connection streams, clamped SwiGLU MoE) served
by the plain engine (TP=1) in the same test through the same scripted scenario
(`tp_util.run_scenario`: chunked prefill beside decodes, an abort, a prefix-cache hit).
Greedy tokens identical, every step's sampled-row logits within 1e-5 (fp32). The hyper-
connection mixing, the pooled indexer and its caches are replicated on every rank; heads, FFN
widths and (EP) experts are split.
"""

from __future__ import annotations

import pytest

from tests.distributed.tp_util import engine, run_scenario
from tests.glm_tiny import save_tiny_glm_text

LOGIT_ATOL = 1e-5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm5_tp")
    save_tiny_glm_text(path, seed=0)
    return path, run_scenario(engine(path))


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "tp2-ep"])
def test_glm5_next_tp2_matches_tp1(reference, ep):
    path, ref = reference
    eng = engine(path, tensor_parallel_size=2, enable_expert_parallel=ep)
    try:
        got = run_scenario(eng)
        shapes = eng.executor.collective_rpc("cache_shapes")
    finally:
        eng.shutdown()
    assert ref.prefix_hit_tokens > 0 and got.prefix_hit_tokens == ref.prefix_hit_tokens
    assert got.tokens == ref.tokens and all(len(ref.tokens[r]) == 32 for r in "abce")
    diff = max((a - b).abs().max().item() for a, b in zip(ref.logits, got.logits, strict=True))
    assert diff <= LOGIT_ATOL
    assert any("index_pool_keys" in layer for layer in shapes[0])
    for layer in shapes[0]:  # tiny glm: 4 KDA heads, pooled-indexer keys of 16
        if "recurrent_state" in layer:
            assert layer["recurrent_state"][1] == 4 // 2
        if "index_pool_keys" in layer:
            assert layer["index_pool_keys"][2:] == (16,)
