"""Prefix caching end to end: reference cases C06 and C07, I2 cache transparency per family,
eviction under memory pressure, concurrent sharers, multi-turn reuse, conservation (I4).

"Equal" = identical greedy token ids and top-5 logprobs of every generated token within 1e-5
(fp32 CPU). Oracle for outputs: the same request run cold in an engine with prefix caching off.
Oracle for checkpoints: the state after exactly L tokens, fed one token per step through
`SequenceRunner` (the recurrent decode path). Free cache memory is NaN-poisoned after every
step (free state slots, unhashed free blocks, unkeyed checkpoints), so reading a recycled slot
or an unwritten row shows up as a non-finite logprob.
"""

from __future__ import annotations

import math

import pytest

from hyla.models.runner import SequenceRunner
from hyla.request import SamplingParams
from tests.engine.engine_util import (
    GREEDY,
    assert_all_free,
    assert_same_completion,
    load,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
    save_checkpoint,
)

STATEFUL = ("kimi_linear", "qwen3_next")  # KDA+MLA, GDN+GQA; deepseek_v32 is all DSA
FAMILIES = (*STATEFUL, "deepseek_v32")
NAN = float("nan")


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    loaded = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        save_checkpoint(family, path)
        loaded[family] = load(path)
    return loaded


def poison_free(engine) -> None:
    """NaN into every cache row no request or cache entry may read."""
    cm, runner = engine.cache, engine.runner
    rows = cm.slot_pool.free_slot_ids()
    ckpt = cm.prefix.checkpoints if cm.prefix is not None else None
    if ckpt is not None:
        rows += [
            cm.checkpoint_row(c)
            for c in range(ckpt.num_checkpoints)
            if ckpt.keys[c] is None and ckpt.ref_counts[c] == 0
        ]
    blocks = [
        b for b in cm.block_pool.free_block_ids() if cm.block_pool.blocks[b].block_hash is None
    ]
    state_ids = {id(t) for t in runner.state_tensors}
    for layer in runner.caches:
        for t in layer.values():
            if id(t) in state_ids:
                t[rows] = NAN
            elif blocks:
                t[blocks] = NAN


def run_poisoned(engine, requests: dict[str, list[int]], params=GREEDY) -> dict:
    for rid, ids in requests.items():
        engine.add_request(rid, ids, params)
    final = {}
    poison_free(engine)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        poison_free(engine)
    return final


def cold(model, prompt: list[int], params=GREEDY):
    engine = make_engine(model, enable_prefix_caching=False)
    engine.add_request("cold", prompt, params)
    return run_all(engine)["cold"]


def assert_finite(out) -> None:
    for c in out.outputs:
        assert math.isfinite(c.cumulative_logprob)
        for lp in c.logprobs or []:
            assert all(math.isfinite(v) for v in lp.values())


def assert_conserved(engine) -> None:
    """I4 with prefix caching: nothing referenced; cached entries consistent and evictable."""
    assert_all_free(engine)
    pool = engine.cache.block_pool
    assert all(b.ref_count == 0 for b in pool.blocks)
    for h, b in pool.cached.items():
        assert pool.blocks[b].block_hash == h
    prefix = engine.cache.prefix
    ckpt = prefix.checkpoints
    assert ckpt.num_free == ckpt.num_checkpoints and not any(ckpt.ref_counts)
    assert all(h in pool.cached for h in ckpt.cached)  # no checkpoint without its blocks
    assert not prefix._pending and not prefix._in_flight and not prefix._restoring


def oracle_states(model, tokens: list[int], lengths: set[int]) -> dict[int, dict]:
    """Linear-layer states after exactly L tokens, fed one token per step."""
    runner = SequenceRunner(model, 1, len(tokens), block_size=16)
    slot = runner.state_slots[0]
    states = {}
    for t, tok in enumerate(tokens, start=1):
        runner.step({0: [tok]})
        if t in lengths:
            states[t] = {
                (i, name): layer[name][slot].clone()
                for i, layer in enumerate(runner.caches)
                for name in ("recurrent_state", "conv_state")
                if name in layer
            }
    return states


def checkpoint_state(engine, tokens: list[int], length: int) -> dict | None:
    prefix = engine.cache.prefix
    from hyla.cache.prefix import extend_block_hashes

    key = extend_block_hashes([], tokens[:length], engine.cache.block_size)[-1]
    c = prefix.checkpoints.lookup(key)
    if c is None:
        return None
    row = engine.cache.checkpoint_row(c)
    return {
        (i, name): layer[name][row]
        for i, layer in enumerate(engine.runner.caches)
        for name in ("recurrent_state", "conv_state")
        if name in layer
    }


# -- C06 -------------------------------------------------------------------------------------

C06_R1_LENS = (63, 64, 65, 127, 128, 129, 130)


@pytest.mark.parametrize("family", STATEFUL)
def test_c06_checkpoints_are_interior_states(models, family):
    model = models[family]
    base = prompt_ids(130, seed=6)
    oracle = oracle_states(model, base[:128], {48, 64, 112, 128})
    for n1 in C06_R1_LENS:
        r1 = base[:n1]
        r2 = r1[:128] + prompt_ids(40, seed=60 + n1)
        engine = make_engine(model, state_checkpoint_stride=64, max_num_batched_tokens=256)
        outs = run_poisoned(engine, {"r1": r1})
        outs.update(run_poisoned(engine, {"r2": r2}))
        assert_same_completion(outs["r2"], cold(model, r2))
        assert_finite(outs["r2"])
        # strides 64, 128, and the last full block before r1's last prompt token
        kept = {64 * k for k in (1, 2) if 64 * k <= n1} | {(n1 - 1) // 16 * 16}
        expected_hit = max(c for c in kept if c <= 128)
        assert outs["r2"].num_cached_tokens == expected_hit, n1
        for length in (48, 64, 112, 128):
            got = checkpoint_state(engine, base, length)
            if length <= n1 and length == expected_hit:
                assert got is not None, (n1, length)
            if got is not None:  # every stored checkpoint is the state after exactly L tokens
                for k, ref in oracle[length].items():
                    err = (got[k] - ref).abs().max().item()
                    assert err <= 1e-5, (n1, length, k, err)
        assert_conserved(engine)


# -- C07 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_c07_hit_never_reads_a_recycled_state_slot(models, family):
    model = models[family]
    p = prompt_ids(300, seed=7)
    b = prompt_ids(200, seed=70)
    c = p[:256] + prompt_ids(30, seed=71)
    engine = make_engine(model, max_num_seqs=2, state_checkpoint_stride=128)
    outs = {}
    for rid, ids in (("a", p), ("b", b), ("c", c)):
        outs.update(run_poisoned(engine, {rid: ids}))
    assert outs["c"].num_cached_tokens == 256
    assert_finite(outs["c"])
    assert_same_completion(outs["c"], cold(model, c))
    assert_conserved(engine)


# -- I2 per family, around stride and block multiples ----------------------------------------

SHARED_LENS = (15, 16, 17, 31, 32, 33, 63, 64, 65)


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_equals_cold_around_stride_and_block_multiples(models, family):
    model = models[family]
    base = prompt_ids(80, seed=8)
    engine = make_engine(model, state_checkpoint_stride=32, max_num_batched_tokens=16)
    run_poisoned(engine, {"base": base})  # 16-token chunks: checkpoints at 32 and 64
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=5)
    for n in SHARED_LENS:
        ids = base[:n] + prompt_ids(5, seed=800 + n)
        out = run_poisoned(engine, {f"s{n}": ids}, params)[f"s{n}"]
        granule = 32 if family in STATEFUL else 16
        # the stride rule, or more: an earlier s_n's tail checkpoint at a block boundary
        assert n // granule * granule <= out.num_cached_tokens <= n // 16 * 16, n
        assert_finite(out)
        assert_same_completion(out, cold(model, ids, params))
    assert_conserved(engine)


# -- multi-turn, concurrency, eviction -------------------------------------------------------


def test_multi_turn_reuses_prompt_and_output(models):
    model = models["kimi_linear"]
    engine = make_engine(model, state_checkpoint_stride=32)
    turn1 = prompt_ids(100, seed=9)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=5)
    first = run_poisoned(engine, {"t1": turn1}, params)["t1"]
    turn2 = turn1 + first.outputs[0].token_ids + prompt_ids(20, seed=90)
    second = run_poisoned(engine, {"t2": turn2})["t2"]
    assert second.num_cached_tokens == 128  # 100 prompt + 28 generated tokens reused
    assert_same_completion(second, cold(model, turn2))
    assert_conserved(engine)


@pytest.mark.parametrize("family", STATEFUL)
def test_concurrent_requests_sharing_a_prefix(models, family):
    model = models[family]
    shared = prompt_ids(150, seed=10)
    prompts = {f"q{i}": shared + prompt_ids(3 + i, seed=100 + i) for i in range(5)}
    engine = make_engine(model, state_checkpoint_stride=32, max_num_batched_tokens=64)
    outs = run_poisoned(engine, prompts)
    hits = sorted(o.num_cached_tokens for o in outs.values())
    assert hits[0] == 0 and min(hits[1:]) >= 128  # one computes the prefix, others wait for it
    for rid, ids in prompts.items():
        assert_finite(outs[rid])
        assert_same_completion(outs[rid], cold(model, ids))
    assert_conserved(engine)


def test_eviction_under_memory_pressure(models):
    model = models["qwen3_next"]
    # 24 blocks x 16 = 384 tokens of cache, 4 checkpoints: a few prompts evict older prefixes
    engine = make_engine(
        model,
        num_blocks=24,
        num_state_checkpoints=4,
        state_checkpoint_stride=32,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=64,
    )
    docs = [prompt_ids(100, seed=200 + i) for i in range(5)]
    for i, doc in enumerate(docs):
        run_poisoned(engine, {f"d{i}": doc})
    pool = engine.cache.block_pool
    assert pool.num_evictions > 0
    late = docs[-1][:70] + prompt_ids(6, seed=11)  # recently used: still cached
    early = docs[0][:70] + prompt_ids(6, seed=12)  # evicted long ago
    outs = run_poisoned(engine, {"late": late})
    outs.update(run_poisoned(engine, {"early": early}))
    assert outs["late"].num_cached_tokens == 64 and outs["early"].num_cached_tokens == 0
    for rid, ids in (("late", late), ("early", early)):
        assert_finite(outs[rid])
        assert_same_completion(outs[rid], cold(model, ids))
    assert_conserved(engine)


def test_prompt_logprobs_requests_compute_every_prompt_token(models):
    model = models["kimi_linear"]
    engine = make_engine(model, state_checkpoint_stride=32)
    ids = prompt_ids(70, seed=13)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1, logprobs=1)
    run_poisoned(engine, {"warm": ids})
    out = run_poisoned(engine, {"p": ids}, params)["p"]
    ref = cold(model, ids, params)
    assert out.num_cached_tokens == 0 and len(out.prompt_logprobs) == len(ids)
    for got, want in zip(out.prompt_logprobs[1:], ref.prompt_logprobs[1:], strict=True):
        assert got.keys() == want.keys()
        assert all(abs(got[t] - want[t]) <= 1e-5 for t in got)


def test_metrics_expose_prefix_cache_counters(models):
    from hyla.server.metrics import ServerMetrics

    engine = make_engine(models["kimi_linear"], state_checkpoint_stride=32)
    ids = prompt_ids(70, seed=14)
    run_poisoned(engine, {"a": ids})
    run_poisoned(engine, {"b": ids[:66] + [5]})
    engine.num_in_flight = lambda: 0  # the collector's AsyncEngine hook
    text = ServerMetrics(engine).render()[0].decode()
    stats = engine.get_stats()
    assert stats.prefix_cache_hit_tokens == 64 and stats.prefix_cache_queried_tokens == 137
    assert "hyla_prefix_cache_hit_tokens_total 64.0" in text
    assert "hyla_prefix_cache_queried_tokens_total 137.0" in text
    assert "hyla_prefix_cache_block_only_tokens_total 0.0" in text
    assert f"hyla_prefix_cache_hit_rate {64 / 137}" in text
