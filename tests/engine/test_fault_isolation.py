"""Faults stay with the request that caused them (issue 16 items 2 and 3).

- A step that raises because of one request's input ends that request with finish reason
  "error" and a message naming the exception; its batch neighbours are held, recomputed and
  put back one at a time, and finish with the tokens of their solo runs (the oracle); requests
  queued meanwhile run normally; nothing leaks.
- A non-finite logits row (NaN or Inf, injected into the logits of one request) ends that
  request with "error" and a message; every logprob reported is a number; neighbours equal
  their solo runs.
"""

from __future__ import annotations

import math

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

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def _requests(vocab: int) -> dict[str, list[int]]:
    return {f"r{i}": prompt_ids(5 + 3 * i, 60 + i, vocab) for i in range(4)}


def test_a_failing_request_ends_alone_and_its_neighbours_recompute(kimi):
    model, path = kimi
    vocab = model.config.vocab_size
    prompts = _requests(vocab)
    bad = prompts["r2"]
    engine = make_engine(model, path, max_num_batched_tokens=64)
    execute = engine.runner.execute
    failed = []

    def failing(out, requests, *args, **kw):
        culprit = [r for r in out.num_scheduled_tokens if requests[r].prompt_token_ids == bad]
        if culprit and requests[culprit[0]].num_output_tokens >= 2:  # from r2's third token on
            failed.append(len(out.num_scheduled_tokens))
            raise RuntimeError("bad input")
        return execute(out, requests, *args, **kw)

    engine.runner.execute = failing
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, PARAMS)
    final = {}
    step = 0
    while engine.has_unfinished_requests():
        if step == 3:
            engine.add_request("late", prompt_ids(6, 99, vocab), PARAMS)
        final.update({o.request_id: o for o in engine.step() if o.finished})
        step += 1
    assert_all_free(engine)
    err = final["r2"].outputs[0]
    assert err.finish_reason == "error" and "RuntimeError: bad input" in err.stop_reason
    oracle = make_engine(model, path)
    for rid in ("r0", "r1", "r3", "late"):
        ids = prompts.get(rid, prompt_ids(6, 99, vocab))
        assert final[rid].outputs[0].finish_reason == "length"
        assert_same_completion(final[rid], solo(oracle, ids, PARAMS))
    assert not engine.faults.suspects and engine.faults.probe is None
    assert failed[0] == 4 and failed[-1] >= 1  # first with its neighbours, last on probation


def test_a_request_failing_alone_ends_with_an_error(kimi):
    model, path = kimi
    engine = make_engine(model, path)
    engine.runner.execute = lambda *a, **k: (_ for _ in ()).throw(ValueError("boom"))
    engine.add_request("x", prompt_ids(5, 1), PARAMS)
    out = run_all(engine)["x"].outputs[0]
    assert out.finish_reason == "error" and "ValueError: boom" in out.stop_reason
    assert_all_free(engine)


@pytest.mark.parametrize("poison", ["one_nan", "all_nan", "inf"])
@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next"])
def test_non_finite_logits_end_only_their_request(checkpoints, family, poison):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    prompts = _requests(vocab)
    bad = prompts["r1"]
    engine = make_engine(model, path)
    launch = engine.sampler.launch

    def poisoned(logits, rows, pending=None):
        logits = logits.clone()
        for i, row in enumerate(rows):
            if row.prompt_token_ids == bad and row.num_output_tokens >= 2:
                if poison == "one_nan":
                    logits[i, 3] = math.nan
                elif poison == "all_nan":
                    logits[i] = math.nan
                else:
                    logits[i, 5] = math.inf
        return launch(logits, rows, pending)

    engine.sampler.launch = poisoned
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, PARAMS)
    final = run_all(engine)
    assert_all_free(engine)
    err = final["r1"].outputs[0]
    assert err.finish_reason == "error" and "non-finite" in err.stop_reason
    assert len(err.token_ids) == 2 and len(err.logprobs) == 2
    assert all(math.isfinite(lp) for entry in err.logprobs for lp in entry.values())
    oracle = make_engine(model, path)
    for rid in ("r0", "r2", "r3"):
        assert_same_completion(final[rid], solo(oracle, prompts[rid], PARAMS))


def test_a_poisoned_request_leaves_nothing_in_the_prefix_cache(kimi):
    """Blocks and state checkpoints filed by a request whose logits went non-finite are not
    served to a later request of the same prompt, which runs cold and equals a cold run; a
    clean request's prefix still hits."""
    model, path = kimi
    vocab = model.config.vocab_size
    kw = dict(enable_prefix_caching=True, state_checkpoint_stride=16)
    engine = make_engine(model, path, **kw)
    bad, good = prompt_ids(40, 7, vocab), prompt_ids(40, 8, vocab)
    launch = engine.sampler.launch

    def poisoned(logits, rows, pending=None):
        logits = logits.clone()
        for i, row in enumerate(rows):
            if row.prompt_token_ids == bad and row.num_output_tokens >= 3:
                logits[i, 0] = math.nan
        return launch(logits, rows, pending)

    engine.sampler.launch = poisoned
    engine.add_request("bad", bad, PARAMS)
    engine.add_request("good", good, PARAMS)
    first = run_all(engine)
    assert first["bad"].outputs[0].finish_reason == "error"
    engine.sampler.launch = launch
    engine.add_request("again", bad + [5], PARAMS)
    engine.add_request("good2", good + [5], PARAMS)
    second = run_all(engine)
    assert second["again"].num_cached_tokens == 0
    assert second["good2"].num_cached_tokens == 32
    cold = make_engine(model, path)
    assert_same_completion(second["again"], solo(cold, bad + [5], PARAMS))
    assert_all_free(engine)


def test_a_fault_in_the_bookkeeping_after_launch_is_isolated_like_a_step_fault(kimi):
    """`Scheduler.update` (blocks and checkpoints filed after the launch) raising for one
    request's step: that request ends with an error, its neighbours recompute and equal their
    solo runs (it used to fail every request in flight)."""
    model, path = kimi
    vocab = model.config.vocab_size
    prompts = _requests(vocab)
    bad = prompts["r1"]
    engine = make_engine(model, path, max_num_batched_tokens=64)
    update = engine.scheduler.update

    def failing(out):
        reqs = [engine.scheduler.requests.get(r) for r in out.num_scheduled_tokens]
        if any(r is not None and r.prompt_token_ids == bad and r.num_output_tokens >= 1
               for r in reqs):  # fmt: skip
            raise RuntimeError("bookkeeping")
        return update(out)

    engine.scheduler.update = failing
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, PARAMS)
    final = run_all(engine)
    assert_all_free(engine)
    err = final["r1"].outputs[0]
    assert err.finish_reason == "error" and "RuntimeError: bookkeeping" in err.stop_reason
    oracle = make_engine(model, path)
    for rid in ("r0", "r2", "r3"):
        assert final[rid].outputs[0].finish_reason == "length"
        assert_same_completion(final[rid], solo(oracle, prompts[rid], PARAMS))
