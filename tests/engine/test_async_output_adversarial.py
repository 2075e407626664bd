"""Adversarial cases of `async_output` against the synchronous engine (see test_async_output):

- an abort or a timeout that arrives after a request's last token was sampled but before that
  token was detokenized (the token completes a stop string) must not change how the request
  ended: the synchronous engine had already finished it with reason "stop";
- the row a stop-string-finished request computes in the step after its stop (dropped) must
  not be sampled: unseeded requests share one generator.
"""

from __future__ import annotations

import pytest

from hyla.engine.llm_engine import LLMEngine
from hyla.request import RequestOutput, SamplingParams
from tests.engine.engine_util import (
    make_engine,
    one_torch_thread,
    prompt_ids,
)
from tests.engine.test_async_output import compare, drive, stop_requests


def _run(engine: LLMEngine, requests: dict, act_at: int, act) -> dict[str, RequestOutput]:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    final: dict[str, RequestOutput] = {}
    step = 0
    while engine.has_unfinished_requests():
        if step == act_at:
            act(engine)
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        step += 1
    return final, []


def _stop_step(model, path) -> int:
    """The step (0-based) of the synchronous engine whose outputs finish "stop"."""
    engine = make_engine(model, path, async_output=False)
    requests = stop_requests(engine)
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    step = 0
    with one_torch_thread():
        while True:
            if any(o.finished and o.request_id == "stop" for o in engine.step()):
                return step
            step += 1


def _pending(engine: LLMEngine, rid: str) -> bool:
    """`rid`'s last token is not processed yet: deferred, or still on the device."""
    inflight = engine._inflight
    return rid in engine._deferred or (inflight is not None and rid in inflight.rows)


def _abort(engine: LLMEngine) -> None:
    assert _pending(engine, "stop#0") == engine.async_output  # stop string not seen yet
    engine.abort_request(["stop", "stop_incl"])


def _expire(engine: LLMEngine) -> None:
    assert _pending(engine, "stop#0") == engine.async_output
    for rid in ("stop", "stop_incl"):
        group = engine._groups.get(rid)  # gone from the synchronous engine
        if group is not None:
            group.metrics.arrival_time -= 1e6  # older than request_timeout


@pytest.mark.parametrize("act", [_abort, _expire], ids=["abort", "timeout"])
def test_abort_or_timeout_after_stop_string_token_keeps_stop(kimi, act):
    model, path = kimi
    at = _stop_step(model, path) + 1  # sync: already finished; async: token not processed

    def script(engine):
        final, stream = _run(engine, stop_requests(engine), at, act)
        for rid in ("stop", "stop_incl"):
            assert final[rid].outputs[0].finish_reason == "stop"
            assert final[rid].outputs[0].stop_reason is not None
        return final, stream

    compare(model, path, script, request_timeout=1e5)


def test_dropped_row_draws_nothing_from_the_shared_generator(kimi):
    """An unseeded request stopped by a stop string computes one more row that is dropped; it
    must not be sampled, or it would shift the shared generator (engine seed) under the other
    unseeded requests and change their tokens."""
    model, path = kimi
    vocab = model.config.vocab_size
    kw = dict(temperature=1.0, max_tokens=12, ignore_eos=True)
    requests = {
        "stop": (prompt_ids(6, 11, vocab), SamplingParams(stop=["e", " ", "a", "o"], **kw)),
        "u1": (prompt_ids(8, 12, vocab), SamplingParams(**kw)),
        "u2": (prompt_ids(9, 13, vocab), SamplingParams(**kw)),
    }

    def script(engine):
        final, stream = drive(engine, requests)
        assert final["stop"].outputs[0].finish_reason == "stop"
        assert len(final["stop"].outputs[0].token_ids) < 12
        return final, stream

    compare(model, path, script)
