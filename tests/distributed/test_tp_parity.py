"""Tensor and expert parallelism on the CPU (gloo) against the single-process engine.

Oracle: the same checkpoint served by the plain engine (TP=1, no executor) in the same test,
through the same scripted scenario (`tp_util.run_scenario`: chunked prefill beside decodes, an
abort, a prefix-cache hit, 32 greedy tokens per request). Every step's sampled-row logits
agree within 1e-5 and every request's tokens are identical; every block, slot and checkpoint
is free afterwards. Each rank's caches hold its own heads only and the same number of blocks
and state rows (the minimum the ranks agreed on).
"""

from __future__ import annotations

import pytest

from hyla.cache.spec import conv_dim
from hyla.models.loader import load_config
from tests.distributed.tp_util import engine, run_scenario
from tests.hf_tiny import save_tiny_hf_model

LOGIT_ATOL = 1e-5
# (family, tensor_parallel_size, enable_expert_parallel); qwen3_next has 2 linear key heads,
# so no TP=4
CASES = [
    ("kimi_linear", 2, False), ("kimi_linear", 2, True), ("kimi_linear", 4, False),
    ("deepseek_v32", 2, False), ("deepseek_v32", 2, True), ("deepseek_v32", 4, True),
    ("qwen3_next", 2, False), ("qwen3_next", 2, True),
]  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`reference(family)` -> (checkpoint path, the TP=1 run), each built once."""
    cache = {}

    def get(family: str):
        if family not in cache:
            path = tmp_path_factory.mktemp(family)
            save_tiny_hf_model(family, path)
            plain = engine(path)
            cache[family] = (path, run_scenario(plain))
        return cache[family]

    return get


@pytest.mark.parametrize(
    "family,tp,ep", CASES, ids=[f"{f}-tp{n}{'-ep' if e else ''}" for f, n, e in CASES]
)
def test_tp_matches_single_process(reference, family, tp, ep):
    path, ref = reference(family)
    eng = engine(path, tensor_parallel_size=tp, enable_expert_parallel=ep)
    try:
        got = run_scenario(eng)
        shapes = eng.executor.collective_rpc("cache_shapes")
    finally:
        eng.shutdown()
    assert ref.aborted == got.aborted == ["d"]
    assert ref.prefix_hit_tokens > 0 and got.prefix_hit_tokens == ref.prefix_hit_tokens
    assert got.tokens == ref.tokens
    assert all(len(ref.tokens[r]) == 32 for r in "abce") and len(ref.tokens["f"]) == 4
    assert len(got.logits) == len(ref.logits)
    diff = max((a - b).abs().max().item() for a, b in zip(ref.logits, got.logits, strict=True))
    print(f"{family} tp={tp} ep={ep}: max |logit diff| {diff:.2e} over {len(ref.logits)} steps")
    assert diff <= LOGIT_ATOL
    _assert_rank_caches(shapes, eng, load_config(path), tp)
    _assert_same_logprobs(ref.logprobs["f"], got.logprobs["f"])


def _assert_same_logprobs(ref: list, got: list) -> None:
    """Prompt and sampled top logprobs: the same token ids, values within LOGIT_ATOL."""
    flat_ref = [d for part in ref for d in part if d]
    flat_got = [d for part in got for d in part if d]
    assert len(flat_ref) == len(flat_got) > 10
    for a, b in zip(flat_ref, flat_got, strict=True):
        assert a.keys() == b.keys()
        for t in a:
            assert abs(_value(a[t]) - _value(b[t])) <= LOGIT_ATOL


def _value(entry) -> float:
    return entry if isinstance(entry, float) else entry.logprob


def _assert_rank_caches(shapes, eng, config, tp: int) -> None:
    """Same pools on every rank; linear layers' state and GQA's cache hold the rank's heads;
    MLA/DSA latents are replicated."""
    plan = eng.cache_plan
    assert len(shapes) == tp
    for rank_shapes in shapes:
        assert rank_shapes == shapes[0]
        for i, layer in enumerate(rank_shapes):
            if "recurrent_state" in layer:
                assert layer["recurrent_state"][:2] == (
                    plan.num_slots + plan.num_checkpoints,
                    config.linear.num_v_heads // tp,
                )
            if "conv_state" in layer:  # q | k | v channels of the rank's heads
                assert layer["conv_state"][1] * tp == conv_dim(config)
            if "k" in layer:  # GQA: KV heads split, one each when fewer than the ranks
                assert layer["k"][2] == max(config.gqa.num_kv_heads // tp, 1)
            if "latent" in layer:  # MLA/DSA: the per-token latent, whole on every rank
                assert layer["latent"][2] == config.mla.latent_dim
            for name, shape in layer.items():
                if name in ("latent", "k", "v", "index_keys"):
                    assert shape[0] == plan.num_blocks, (i, name)


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32", "qwen3_next"])
def test_world_size_one_through_the_executor(reference, family):
    """The distributed path with one rank (executor, per-step plan, driver runner; no process
    started) is the plain engine bit for bit."""
    path, ref = reference(family)
    eng = engine(path, distributed_executor_backend="mp")
    try:
        assert eng.executor is not None and not eng.executor.worker_pids
        got = run_scenario(eng)
    finally:
        eng.shutdown()
    assert got.tokens == ref.tokens
    assert all(bool((a == b).all()) for a, b in zip(ref.logits, got.logits, strict=True))
