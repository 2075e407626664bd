"""Adversarial cases of the one-step pipeline's fault isolation (issue 16 items 2 and 3).

Oracles: a solo run of the same request in a fresh engine; the cache manager's counters (I4).
"""

from __future__ import annotations

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import (
    assert_i4,
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
    assert_i4(engine)
    for rid in ("x", "y"):
        assert final[rid].outputs[0].finish_reason == "error"
    oracle = make_engine(model, path)
    for rid in ("a", "b"):
        assert final[rid].outputs[0].finish_reason == "length", rid
        assert_same_completion(final[rid], solo(oracle, prompts[rid], PARAMS))


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
    assert_i4(engine)
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
    assert_i4(engine)
    assert [c.finish_reason for c in final["x"].outputs] == ["error", "error"]
    oracle = make_engine(model, path)
    for rid in ("p0", "p1", "p2"):
        assert_same_completion(final[rid], solo(oracle, prompts[rid], n2))


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

    engine.requests.seqs["r1#0"].detokenizer.update = broken
    final = run_all(engine)
    err = final["r1"].outputs[0]
    assert err.finish_reason == "error" and "UnicodeDecodeError" in err.stop_reason
    assert_i4(engine)
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
    assert_i4(engine)
    oracle = make_engine(model, path)
    for rid in ("r0", "r1", "r2"):
        assert results[rid].outputs[0].finish_reason == "length"
        assert_same_completion(results[rid], solo(oracle, prompts[rid], PARAMS))


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
    assert_i4(engine)
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
    assert_i4(engine)
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
    assert engine.requests.seqs["p#0"].request.num_computed_tokens == 0  # no room beside r
    engine.faults.hold("p#0")  # as after a failed step: a suspect, put back alone
    for _ in range(50):
        outs += engine.step()
        if not engine.has_unfinished_requests():
            break
    final = {o.request_id: o for o in outs if o.finished}
    assert set(final) == {"r", "p"}
    assert_i4(engine)
    oracle = make_engine(model, path)
    for rid, ids in prompts.items():
        assert final[rid].outputs[0].finish_reason == "length"
        assert_same_completion(final[rid], solo(oracle, ids, PARAMS))
