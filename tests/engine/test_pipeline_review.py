"""Adversarial cases of the one-step pipeline's fault isolation (issue 16 items 2 and 3).

Oracles: a solo run of the same request in a fresh engine; the cache manager's counters (I4).
"""

from __future__ import annotations

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import (
    assert_all_free,
    assert_same_completion,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
    solo,
)

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
BAD = 2  # a token id that makes the forward raise (prompt_ids draws from 3 up)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def _fail_on_token(engine, failed: list[int]) -> None:
    """The forward raises for any step scheduling a request whose prompt holds `BAD`."""
    execute = engine.runner.execute

    def failing(out, requests, *args, **kw):
        if any(BAD in requests[r].prompt_token_ids for r in out.num_scheduled_tokens):
            failed.append(len(out.num_scheduled_tokens))
            raise RuntimeError("bad token")
        return execute(out, requests, *args, **kw)

    engine.runner.execute = failing


def test_a_culprit_arriving_during_probation_does_not_end_the_innocent_probe(kimi):
    """The first failure holds a, b and x; a comes back on probation. A second request with the
    bad token arrives then: the step holding the probe and it fails, and only the requests with
    the bad token may end with an error (the probe is innocent)."""
    model, path = kimi
    vocab = model.config.vocab_size
    prompts = {"a": prompt_ids(5, 1, vocab), "b": prompt_ids(7, 2, vocab)}
    prompts["x"] = prompt_ids(4, 3, vocab) + [BAD]
    engine = make_engine(model, path)
    failed: list[int] = []
    _fail_on_token(engine, failed)
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, PARAMS)
    final = {o.request_id: o for o in engine.step() if o.finished}
    assert failed == [3]
    engine.add_request("y", prompt_ids(6, 4, vocab) + [BAD], PARAMS)
    final.update(run_all(engine))
    assert_all_free(engine)
    for rid in ("x", "y"):
        assert final[rid].outputs[0].finish_reason == "error"
    oracle = make_engine(model, path)
    for rid in ("a", "b"):
        assert final[rid].outputs[0].finish_reason == "length", rid
        assert_same_completion(final[rid], solo(oracle, prompts[rid], PARAMS))


def _assert_i4(engine) -> None:
    """Every block, slot and state checkpoint back: no reference held by anyone."""
    assert_all_free(engine)
    prefix = engine.cache.prefix
    if prefix is not None:
        assert not any(prefix.checkpoints.ref_counts)
        assert not prefix._pending and not prefix._tails


def test_failures_under_preemption_end_only_the_culprit(kimi):
    """A cache of 6 blocks for 4 requests of 3 blocks each (preemptions) and a failing one:
    every request finishes (a probe that cannot run alone runs with the others rather than
    wait forever), the innocent ones equal their solo runs, nothing leaks."""
    model, path = kimi
    vocab = model.config.vocab_size
    engine = make_engine(model, path, num_blocks=6, max_model_len=64, max_num_seqs=4)
    failed: list[int] = []
    _fail_on_token(engine, failed)
    prompts = {f"r{i}": prompt_ids(30, 70 + i, vocab) for i in range(3)}
    prompts["x"] = prompt_ids(3, 3, vocab) + [BAD]
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, PARAMS)
    final = {}
    for _ in range(300):
        final.update({o.request_id: o for o in engine.step() if o.finished})
        if not engine.has_unfinished_requests():
            break
    assert set(final) == set(prompts) and failed
    assert final["x"].outputs[0].finish_reason == "error"
    _assert_i4(engine)
    oracle = make_engine(model, path)
    for rid in ("r0", "r1", "r2"):
        assert final[rid].outputs[0].finish_reason == "length", rid
        assert_same_completion(final[rid], solo(oracle, prompts[rid], PARAMS))


def test_failures_with_prefix_checkpoints_and_n2_leak_nothing(kimi):
    """Failing steps among prefix hits, interior checkpoints and n=2 groups: the culprit's
    sequences end with an error, the others equal their solo runs, every checkpoint is back."""
    model, path = kimi
    vocab = model.config.vocab_size
    kw = dict(enable_prefix_caching=True, state_checkpoint_stride=16, max_num_batched_tokens=40)
    engine = make_engine(model, path, **kw)
    failed: list[int] = []
    _fail_on_token(engine, failed)
    shared = prompt_ids(40, 9, vocab)
    n2 = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1, n=2)
    prompts = {f"p{i}": shared + prompt_ids(3 + i, 20 + i, vocab) for i in range(3)}
    prompts["x"] = shared + [BAD]
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, n2)
    final = run_all(engine)
    assert failed
    _assert_i4(engine)
    assert [c.finish_reason for c in final["x"].outputs] == ["error", "error"]
    oracle = make_engine(model, path)
    for rid in ("p0", "p1", "p2"):
        assert_same_completion(final[rid], solo(oracle, prompts[rid], n2))


def test_aborts_of_pending_tokens_leak_nothing(kimi):
    """Aborts between steps (a token in flight for each request) and a second abort of the same
    id: the final output says "abort" once, the survivors equal their solo runs."""
    model, path = kimi
    vocab = model.config.vocab_size
    kw = dict(enable_prefix_caching=True, state_checkpoint_stride=16)
    engine = make_engine(model, path, **kw)
    prompts = {f"r{i}": prompt_ids(20 + i, 40 + i, vocab) for i in range(4)}
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, params)
    outs = []
    for _ in range(3):
        outs += engine.step()
    assert engine._inflight is not None
    engine.abort_request(["r1", "r3"])
    engine.abort_request("r1")
    final = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs.append(o)
            if o.finished:
                final[o.request_id] = o
    assert [o.request_id for o in outs if o.finished].count("r1") == 1
    assert final["r1"].outputs[0].finish_reason == "abort"
    assert all(lp is not None for o in outs for c in o.outputs for lp in c.logprobs)
    _assert_i4(engine)
    oracle = make_engine(model, path)
    for rid in ("r0", "r2"):
        assert_same_completion(final[rid], solo(oracle, prompts[rid], params))


def test_a_prefill_poisoned_at_its_first_token_leaves_nothing_in_the_prefix_cache(kimi):
    """Non-finite logits at the first sampled token of a chunked prefill that saved interior
    checkpoints: a later request with the same prompt prefix runs cold (no hit) and equals a
    cold run; every checkpoint is back."""
    model, path = kimi
    vocab = model.config.vocab_size
    kw = dict(enable_prefix_caching=True, state_checkpoint_stride=16, max_num_batched_tokens=24)
    engine = make_engine(model, path, **kw)
    bad = prompt_ids(50, 17, vocab)
    launch = engine.sampler.launch

    def poisoned(logits, rows, pending=None):
        logits = logits.clone()
        for i, row in enumerate(rows):
            if row.prompt_token_ids == bad:
                logits[i] = float("-inf")
        return launch(logits, rows, pending)

    engine.sampler.launch = poisoned
    engine.add_request("bad", bad, PARAMS)
    first = run_all(engine)["bad"].outputs[0]
    assert first.finish_reason == "error" and first.token_ids == []
    engine.sampler.launch = launch
    engine.add_request("again", bad[:40] + [5], PARAMS)
    again = run_all(engine)["again"]
    assert again.num_cached_tokens == 0
    _assert_i4(engine)
    assert_same_completion(again, solo(make_engine(model, path), bad[:40] + [5], PARAMS))


def test_a_failure_while_processing_one_token_ends_only_its_request(kimi):
    """The host work of one request's token raises (its detokenizer here; on a GPU a read may
    raise too): that request ends with "error", the step's other requests go on and equal
    their solo runs, and `step()` does not raise (the async server would end every stream)."""
    model, path = kimi
    vocab = model.config.vocab_size
    prompts = {f"r{i}": prompt_ids(6 + i, 80 + i, vocab) for i in range(3)}
    engine = make_engine(model, path)
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, PARAMS)

    def broken(tokens):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad byte")

    engine._seq_of["r1#0"].detokenizer.update = broken
    final = run_all(engine)
    err = final["r1"].outputs[0]
    assert err.finish_reason == "error" and "UnicodeDecodeError" in err.stop_reason
    _assert_i4(engine)
    oracle = make_engine(model, path)
    for rid in ("r0", "r2"):
        assert_same_completion(final[rid], solo(oracle, prompts[rid], PARAMS))


def test_async_engine_fails_one_stream_and_the_others_finish(kimi):
    """Through the AsyncEngine: the stream of the request with the bad token raises
    RequestFailedError; the streams around it finish with their solo runs' tokens."""
    import asyncio

    from hyla.engine.async_engine import AsyncEngine
    from hyla.engine.async_stream import RequestFailedError

    model, path = kimi
    vocab = model.config.vocab_size
    prompts = {f"r{i}": prompt_ids(5 + i, 90 + i, vocab) for i in range(3)}
    prompts["x"] = prompt_ids(4, 3, vocab) + [BAD]
    engine = make_engine(model, path)
    failed: list[int] = []
    _fail_on_token(engine, failed)

    async def consume(aengine, rid):
        stream = await aengine.add_request(prompts[rid], PARAMS, rid)
        try:
            return [o async for o in stream][-1]
        except RequestFailedError as e:
            return e

    async def run():
        aengine = AsyncEngine(engine)
        aengine.start()
        try:
            results = await asyncio.gather(*(consume(aengine, r) for r in prompts))
        finally:
            await aengine.shutdown(drain=False)
        return dict(zip(prompts, results, strict=True))

    results = asyncio.run(run())
    assert isinstance(results["x"], RequestFailedError) and failed
    _assert_i4(engine)
    oracle = make_engine(model, path)
    for rid in ("r0", "r1", "r2"):
        assert results[rid].outputs[0].finish_reason == "length"
        assert_same_completion(results[rid], solo(oracle, prompts[rid], PARAMS))


def test_a_timeout_with_a_token_in_flight_ends_only_its_request(kimi):
    """A request that times out while its token is on the device: "timeout" once, its token
    dropped, the others equal their solo runs, nothing leaks."""
    model, path = kimi
    vocab = model.config.vocab_size
    prompts = {f"r{i}": prompt_ids(6 + i, 100 + i, vocab) for i in range(3)}
    engine = make_engine(model, path, request_timeout=3600.0)
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, PARAMS)
    outs = engine.step() + engine.step()
    assert engine._inflight is not None and engine._seq_of["r1#0"].request.num_placeholders
    engine._groups["r1"].metrics.arrival_time -= 7200.0
    while engine.has_unfinished_requests():
        outs += engine.step()
    final = {o.request_id: o for o in outs if o.finished}
    assert [o.request_id for o in outs if o.finished].count("r1") == 1
    assert final["r1"].outputs[0].finish_reason == "timeout"
    _assert_i4(engine)
    oracle = make_engine(model, path)
    for rid in ("r0", "r2"):
        assert_same_completion(final[rid], solo(oracle, prompts[rid], PARAMS))


def test_best_of_with_a_failing_group_ends_the_group_and_spares_the_others(kimi):
    """best_of=3, n=1 for a request with the bad token beside a seeded best_of request: the
    first ends with "error", the second equals its solo run (same seeds, same winner)."""
    model, path = kimi
    vocab = model.config.vocab_size
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=4, best_of=3, n=1, logprobs=1)
    good, bad = prompt_ids(9, 110, vocab), prompt_ids(5, 111, vocab) + [BAD]
    engine = make_engine(model, path)
    failed: list[int] = []
    _fail_on_token(engine, failed)
    engine.add_request("good", good, params)
    engine.add_request("bad", bad, params)
    final = run_all(engine)
    assert final["bad"].outputs[0].finish_reason == "error"
    _assert_i4(engine)
    assert_same_completion(final["good"], solo(make_engine(model, path), good, params))


def test_a_sampler_failure_for_one_row_ends_only_its_request(kimi):
    """The sampler raises (before drawing) for the rows of one request, from its third token
    on, while the step before is in flight: that request ends with "error", its neighbours
    (seeded and penalised, so a replayed draw or a lost pending token would show) equal their
    solo runs, nothing leaks."""
    model, path = kimi
    vocab = model.config.vocab_size
    params = SamplingParams(
        temperature=0.9, seed=3, max_tokens=6, ignore_eos=True, logprobs=1,
        repetition_penalty=1.3, frequency_penalty=0.5,
    )  # fmt: skip
    prompts = {f"r{i}": prompt_ids(6 + i, 120 + i, vocab) for i in range(3)}
    prompts["x"] = prompt_ids(4, 3, vocab) + [BAD]
    engine = make_engine(model, path)
    launch = engine.sampler.launch

    def failing(logits, rows, pending=None):
        if any(BAD in r.prompt_token_ids and r.num_output_tokens >= 2 for r in rows):
            raise IndexError("sampler")
        return launch(logits, rows, pending)

    engine.sampler.launch = failing
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, params)
    final = run_all(engine)
    err = final["x"].outputs[0]
    assert err.finish_reason == "error" and "IndexError" in err.stop_reason
    assert len(err.token_ids) == 2
    _assert_i4(engine)
    oracle = make_engine(model, path)
    for rid in ("r0", "r1", "r2"):
        assert_same_completion(final[rid], solo(oracle, prompts[rid], params))


def test_a_probe_without_cache_to_run_alone_runs_with_the_others(kimi):
    """A suspect back on probation while a running request holds most of the cache: it cannot
    run alone, so the step schedules everyone rather than nothing forever; both finish equal to
    their solo runs, nothing leaks."""
    model, path = kimi
    vocab = model.config.vocab_size
    engine = make_engine(model, path, num_blocks=6, max_model_len=64, max_num_seqs=4)
    prompts = {"r": prompt_ids(58, 130, vocab), "p": prompt_ids(40, 131, vocab)}
    engine.add_request("r", prompts["r"], PARAMS)
    outs = engine.step()
    engine.add_request("p", prompts["p"], PARAMS)
    outs += engine.step()
    assert engine._seq_of["p#0"].request.num_computed_tokens == 0  # no room beside r
    engine._hold("p#0")  # as after a failed step: a suspect, put back alone
    for _ in range(50):
        outs += engine.step()
        if not engine.has_unfinished_requests():
            break
    final = {o.request_id: o for o in outs if o.finished}
    assert set(final) == {"r", "p"}
    _assert_i4(engine)
    oracle = make_engine(model, path)
    for rid, ids in prompts.items():
        assert final[rid].outputs[0].finish_reason == "length"
        assert_same_completion(final[rid], solo(oracle, ids, PARAMS))


@pytest.mark.parametrize("end", ["abort", "hold"])
def test_a_poisoned_step_read_after_its_request_released_its_cache(kimi, end):
    """A request's non-finite logits row is still on the device when its cache is released
    (an abort; a hold after the next step failed): its blocks were filed in the prefix cache
    meanwhile, and must not be served to a later request of the same prompt (cold run)."""
    model, path = kimi
    vocab = model.config.vocab_size
    kw = dict(enable_prefix_caching=True, state_checkpoint_stride=16)
    engine = make_engine(model, path, **kw)
    bad = prompt_ids(40, 140, vocab)
    launch = engine.sampler.launch
    poisoned_launches = []

    def poisoned(logits, rows, pending=None):
        logits = logits.clone()
        for i, row in enumerate(rows):
            if row.prompt_token_ids == bad and row.num_output_tokens >= 2:
                logits[i] = float("nan")
                poisoned_launches.append(i)
        return launch(logits, rows, pending)

    engine.sampler.launch = poisoned
    engine.add_request("bad", bad, PARAMS)
    while not poisoned_launches:
        engine.step()
    assert engine._inflight is not None  # the poisoned row not read yet
    if end == "abort":
        engine.abort_request("bad")
    else:
        engine._hold("bad#0")  # what `_step_failed` does to a neighbour of a culprit
    engine.sampler.launch = launch
    final = {o.request_id: o for o in engine.flush() if o.finished}
    final.update(run_all(engine))
    assert final["bad"].outputs[0].finish_reason == ("abort" if end == "abort" else "error")
    engine.add_request("again", bad + [5], PARAMS)
    again = run_all(engine)["again"]
    assert again.num_cached_tokens == 0
    _assert_i4(engine)
    assert_same_completion(again, solo(make_engine(model, path), bad + [5], PARAMS))


def test_a_stop_string_across_tokens_with_n2_and_neighbours(kimi):
    """n=2 greedy with a stop string made of the end of one token and the start of the next
    (in flight when the first is read): both completions stop where the unstopped run's text
    first holds it (the oracle), with finish reason "stop"; nothing leaks."""
    model, path = kimi
    engine = make_engine(model, path)
    plain = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    base = solo(engine, "hello world", plain).outputs[0]
    tok = engine.tokenizer
    pieces = [tok.decode(base.token_ids[: k + 1]) for k in range(len(base.token_ids))]
    k = next(k for k in range(2, 7) if len(pieces[k]) > len(pieces[k - 1]) > len(pieces[k - 2]))
    cut = len(pieces[k - 1])
    stop = base.text[cut - 1 : cut + 1]
    expected = base.text[: base.text.index(stop)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, n=2, stop=[stop])
    engine.add_request("s", "hello world", params)
    engine.add_request("other", "the quick brown", plain)
    final = run_all(engine)
    for c in final["s"].outputs:
        assert c.finish_reason == "stop" and c.stop_reason == stop and c.text == expected
    _assert_i4(engine)
