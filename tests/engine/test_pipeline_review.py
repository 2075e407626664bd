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
