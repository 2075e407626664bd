"""Adversarial cases of the one-step pipeline around tokens in flight: non-finite rows and the
prefix cache, aborts and timeouts of pending tokens, stop strings across tokens (issue 16, 18).

Oracles: a solo (cold) run of the same request in a fresh engine; the unstopped run's text; the
cache manager's counters (I4).
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


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


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
    assert_i4(engine)
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
    assert_i4(engine)
    assert_same_completion(again, solo(make_engine(model, path), bad[:40] + [5], PARAMS))


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
    assert engine._inflight is not None and engine.requests.seqs["r1#0"].request.num_placeholders
    engine.requests.groups["r1"].metrics.arrival_time -= 7200.0
    while engine.has_unfinished_requests():
        outs += engine.step()
    final = {o.request_id: o for o in outs if o.finished}
    assert [o.request_id for o in outs if o.finished].count("r1") == 1
    assert final["r1"].outputs[0].finish_reason == "timeout"
    assert_i4(engine)
    oracle = make_engine(model, path)
    for rid in ("r0", "r2"):
        assert_same_completion(final[rid], solo(oracle, prompts[rid], PARAMS))


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
        engine.faults.hold("bad#0")  # as `FaultPolicy.step_failed` holds a culprit's neighbour
    engine.sampler.launch = launch
    final = {o.request_id: o for o in engine.flush() if o.finished}
    final.update(run_all(engine))
    assert final["bad"].outputs[0].finish_reason == ("abort" if end == "abort" else "error")
    engine.add_request("again", bad + [5], PARAMS)
    again = run_all(engine)["again"]
    assert again.num_cached_tokens == 0
    assert_i4(engine)
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
    assert_i4(engine)
