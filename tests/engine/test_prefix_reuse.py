"""Prefix reuse wherever a prefix is shared (issue 17), three families, CPU fp32.

- divergence: two requests sharing S tokens, then different, reuse floor(S / s) * s tokens
  (s = stride; the block size B for deepseek_v32, which has no linear layers) whatever the
  chunk budget and the order of arrival; outputs equal a cold run (prefix caching off);
- a 5-turn chat from 20 to ~2,000 tokens at the default stride: each turn reuses all of the
  previous turn but at most one block (its tail checkpoint), outputs equal cold runs;
- identical short prompts: a hit, or the below-block / below-stride counter moves;
- C06 extended: every checkpoint written inside one chunk equals the state after exactly that
  many tokens fed one at a time (`SequenceRunner`, the recurrent decode path);
- checkpoint count and bytes in /metrics.
Free cache rows are NaN-poisoned after every step (`run_poisoned`).
"""

from __future__ import annotations

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import make_engine, prompt_ids, run_all
from tests.engine.test_prefix_cache import (
    FAMILIES,
    STATEFUL,
    _one_thread,  # noqa: F401 (autouse fixture)
    assert_conserved,
    assert_finite,
    assert_same_completion,
    checkpoint_state,
    cold,
    models,  # noqa: F401 (fixture)
    oracle_states,
    run_poisoned,
)

STRIDE = 32
# (shared tokens S, chunk budget, arrival): around stride multiples, inside and beyond the
# first chunk of the budget
DIVERGENCE = [
    (31, 16, "sequential"),
    (32, 48, "concurrent"),
    (33, 256, "sequential"),
    (64, 16, "concurrent"),
    (65, 48, "sequential"),
    (100, 256, "concurrent"),
    (130, 48, "concurrent"),
]
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("family", FAMILIES)
def test_divergence_reuses_whole_strides_of_the_shared_prefix(models, family):  # noqa: F811
    model = models[family]
    granule = STRIDE if family in STATEFUL else 16
    for shared, budget, arrival in DIVERGENCE:
        base = prompt_ids(shared, seed=shared)
        a = base + prompt_ids(24, seed=1000 + shared)  # own suffix > B: a's tail is past S
        b = base + prompt_ids(7, seed=2000 + shared)
        engine = make_engine(model, state_checkpoint_stride=STRIDE, max_num_batched_tokens=budget)
        if arrival == "sequential":
            outs = run_poisoned(engine, {"a": a}, PARAMS)
            outs.update(run_poisoned(engine, {"b": b}, PARAMS))
        else:
            outs = run_poisoned(engine, {"a": a, "b": b}, PARAMS)
        case = (shared, budget, arrival)
        assert outs["a"].num_cached_tokens == 0, case
        assert outs["b"].num_cached_tokens == shared // granule * granule, case
        assert_finite(outs["b"])
        assert_same_completion(outs["b"], cold(model, b, PARAMS))
        assert_conserved(engine)


@pytest.mark.parametrize("family", FAMILIES)
def test_five_turn_chat_reuses_all_but_one_block(models, family):  # noqa: F811
    model = models[family]
    engine = make_engine(model, max_model_len=2304, max_num_batched_tokens=512)
    assert engine.config.cache.state_checkpoint_stride == 256  # the default
    prompt: list[int] = []
    previous = 0
    for turn, message in enumerate((20, 90, 400, 600, 850)):
        prompt = prompt + prompt_ids(message, seed=300 + turn)
        out = run_poisoned(engine, {f"t{turn}": prompt}, PARAMS)[f"t{turn}"]
        if turn:  # the previous turn computed previous prompt + reply but its last token
            assert out.num_cached_tokens >= previous - 16, (turn, out.num_cached_tokens)
        assert_finite(out)
        reference = make_engine(model, max_model_len=2304, enable_prefix_caching=False)
        reference.add_request("cold", prompt, PARAMS)
        assert_same_completion(out, run_all(reference)["cold"])
        prompt = prompt + out.outputs[0].token_ids
        previous = len(prompt) - 1
    assert len(prompt) > 1900
    assert_conserved(engine)


@pytest.mark.parametrize("family", FAMILIES)
def test_identical_short_prompts_hit_or_count(models, family):  # noqa: F811
    model = models[family]
    engine = make_engine(model)  # B = 16, default stride 256
    tiny, short = prompt_ids(10, seed=40), prompt_ids(45, seed=41)
    for rid in ("tiny1", "tiny2"):
        outs = run_poisoned(engine, {rid: tiny}, PARAMS)
    assert outs["tiny2"].num_cached_tokens == 0
    stats = engine.get_stats()
    assert stats.prefix_cache_below_block_queries == 2  # nothing to reuse below one block
    first = run_poisoned(engine, {"short1": short}, PARAMS)["short1"]
    second = run_poisoned(engine, {"short2": short}, PARAMS)["short2"]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 32  # short1's tail
    assert_same_completion(second, cold(model, short, PARAMS))
    stats = engine.get_stats()
    below_stride = 2 if family in STATEFUL else 0  # no stride without linear layers
    assert stats.prefix_cache_below_stride_queries == below_stride
    assert_conserved(engine)


@pytest.mark.parametrize("family", STATEFUL)
def test_c06_every_boundary_inside_one_chunk_is_the_exact_state(models, family):  # noqa: F811
    model = models[family]
    tokens = prompt_ids(300, seed=16)
    lengths = set(range(STRIDE, 300, STRIDE))
    oracle = oracle_states(model, tokens, lengths | {288})
    engine = make_engine(model, state_checkpoint_stride=STRIDE, max_num_batched_tokens=512)
    engine.add_request("r", tokens, SamplingParams(max_tokens=1))
    engine.step()  # the whole prompt in one chunk
    assert engine.cache.prefix.stats.num_checkpoint_saves == len(lengths)
    assert engine.flush()  # its token (outputs come one step later)
    for length in sorted(lengths):
        got = checkpoint_state(engine, tokens, length)
        assert got is not None, length
        for k, ref in oracle[length].items():
            err = (got[k] - ref).abs().max().item()
            assert err <= 1e-5, (length, k, err)


def test_metrics_show_checkpoint_count_and_bytes(models):  # noqa: F811
    from hyla.server.metrics import ServerMetrics

    engine = make_engine(models["kimi_linear"], state_checkpoint_stride=STRIDE)
    run_poisoned(engine, {"a": prompt_ids(100, seed=17)})  # 32, 64, 96 (96 = its tail)
    engine.num_in_flight = lambda: 0  # the collector's AsyncEngine hook
    text = ServerMetrics(engine).render()[0].decode()
    stats = engine.get_stats()
    per = engine.cache_plan.bytes_per_slot
    assert stats.num_cached_checkpoints == 3 and stats.cached_checkpoint_bytes == 3 * per
    assert "hyla_prefix_cache_checkpoints 3.0" in text
    assert f"hyla_prefix_cache_checkpoint_bytes {float(3 * per)}" in text
    assert "hyla_prefix_cache_checkpoint_saves_total 3.0" in text
    assert "hyla_prefix_cache_below_block_queries_total 0.0" in text
