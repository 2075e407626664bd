"""Ready means warm: `LLMEngine.from_path` runs the warm-up before returning, and the warm-up
builds the decode step of every captured batch size (here DecodeGraphs without capture, as on
the CPU in test_cuda_graphs_adversarial) and a prefill of the token bucket, then leaves the
engine idle: every block and slot free, no prefix-cache counts."""

from __future__ import annotations

from hyla.engine.cuda_graphs import DecodeGraphs
from hyla.engine.llm_engine import LLMEngine
from hyla.engine.warmup import warm_up
from hyla.request import SamplingParams
from tests.engine.engine_util import assert_all_free, make_engine, run_all


def test_warm_up_builds_every_decode_batch_size(kimi):
    model, path = kimi
    engine = make_engine(model, path, enable_prefix_caching=True)
    runner = engine.runner
    runner.graphs = DecodeGraphs(model, runner.caches, runner.block_size, (1, 2, 4),
                                 capture=False, max_model_len=engine.max_model_len)  # fmt: skip
    assert warm_up(engine) >= 0
    assert {size for size, _ in runner.graphs.steps} == {1, 2, 4}
    assert_all_free(engine)
    stats = engine.get_stats()
    assert stats.prefix_cache_queries == 0 and stats.num_preemptions == 0
    engine.add_request("x", [3, 4, 5], SamplingParams(temperature=0, max_tokens=3))
    assert len(run_all(engine)["x"].outputs[0].token_ids) == 3


def test_from_path_returns_a_warm_idle_engine(kimi, monkeypatch):
    _, path = kimi
    calls = []
    import hyla.engine.loading as loading

    monkeypatch.setattr(loading, "warm_up", lambda e: calls.append(e) or warm_up(e))
    engine = LLMEngine.from_path(str(path), device="cpu", max_model_len=128)
    assert calls == [engine]
    assert_all_free(engine)


def test_warm_up_runs_prefix_hits_and_leaves_them_harmless(kimi):
    """With prefix caching on a model with linear layers the warm-up also serves hits on its
    prefill (restores, a chunk split at a checkpoint inside it, a long cached context with
    queries of several lengths); afterwards the engine is idle and a request's greedy tokens and
    logprobs equal those of an engine with prefix caching off (the oracle)."""
    model, path = kimi
    engine = make_engine(model, path, enable_prefix_caching=True, state_checkpoint_stride=32)
    hits = []
    start = engine.cache.start
    engine.cache.start = lambda req, hit: (
        hits.append((hit.num_tokens, hit.checkpoint_id)) or (start(req, hit))
    )
    assert warm_up(engine, prefill_tokens=80) >= 0
    reused = [(n, c is not None) for n, c in hits if n]
    assert reused == [(64, True)] * 7  # HIT_QUERY_LENS and one crossing a stride boundary
    assert_all_free(engine)
    assert engine.get_stats().prefix_cache_queries == 0
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    prompt = [1] * 64 + [7, 8, 9, 10, 11]
    engine.add_request("x", prompt, params)
    got = run_all(engine)["x"]
    plain = make_engine(model, path, enable_prefix_caching=False)
    plain.add_request("x", prompt, params)
    want = run_all(plain)["x"]
    assert got.num_cached_tokens == 64
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert abs(got.outputs[0].cumulative_logprob - want.outputs[0].cumulative_logprob) < 1e-4


def test_warm_decode_rows_mixes_hits_with_a_prompt(kimi, monkeypatch):
    """The GPU-only phase `_warm_decode_rows`, run here on the CPU: d one-token requests hitting
    the warm prefill's 64 cached tokens share a step with a 16-token prompt (a mixed step: MLA's
    decode rows beside a prefill sequence), for each d; the engine is left idle."""
    import hyla.engine.warmup as warmup

    model, path = kimi
    engine = make_engine(model, path, enable_prefix_caching=True, state_checkpoint_stride=32)
    assert warm_up(engine, prefill_tokens=80) >= 0
    monkeypatch.setattr(warmup, "HIT_QUERY_LENS", (1, 3))
    hits, steps = [], []
    start = engine.cache.start
    engine.cache.start = lambda req, hit: hits.append(hit.num_tokens) or start(req, hit)
    step = engine.runner.execute
    engine.runner.execute = lambda out, *a, **kw: steps.append(
        sorted(out.num_scheduled_tokens.values())) or step(out, *a, **kw)  # fmt: skip
    warmup._warm_decode_rows(engine, 64)
    assert sorted(n for n in hits if n) == [64] * 4
    assert [1, 16] in steps and [1, 1, 1, 16] in steps
    assert_all_free(engine)


def test_warm_batches_prefill_several_sequences_of_their_own_tokens(kimi):
    """The GPU-only phase `_warm_batches`, run here on the CPU: the prefill budget split over 3
    sequences (an odd token total) and over 16, each sequence its own token (none hits another's
    prefix), each run batched into one prefill step; the engine is left idle."""
    import hyla.engine.warmup as warmup

    model, path = kimi
    engine = make_engine(model, path, enable_prefix_caching=True, max_num_seqs=16)
    steps = []
    step = engine.runner.execute
    engine.runner.execute = lambda out, *a, **kw: steps.append(
        sorted(out.num_scheduled_tokens.values())) or step(out, *a, **kw)  # fmt: skip
    runs = warmup._warm_batches(engine, 101)
    assert [len(r) for r in runs] == [3, 16]
    assert sum(map(len, runs[0])) % 2 == 1 and sum(map(len, runs[0])) <= 101
    for run in runs:
        assert len({p[0] for p in run}) == len(run)
        assert sorted(map(len, run)) in steps
    assert engine.get_stats().prefix_cache_hit_tokens == 0
    assert_all_free(engine)


def test_warm_batches_fill_a_budget_past_max_model_len(kimi):
    """A token budget over max_model_len is still reached in one step: the fewest sequences of
    at most max_model_len - 2 tokens that fill it (fla autotunes per token-count bucket)."""
    import hyla.engine.warmup as warmup

    model, path = kimi
    engine = make_engine(model, path, max_num_seqs=16, max_model_len=64,
                         max_num_batched_tokens=200)  # fmt: skip
    steps = []
    step = engine.runner.execute
    engine.runner.execute = lambda out, *a, **kw: steps.append(
        sum(out.num_scheduled_tokens.values())) or step(out, *a, **kw)  # fmt: skip
    runs = warmup._warm_batches(engine, 200)
    assert [len(r) for r in runs] == [3, 4, 16]
    assert all(len(p) <= 62 for r in runs for p in r)
    assert max(steps) >= 190
    assert_all_free(engine)
