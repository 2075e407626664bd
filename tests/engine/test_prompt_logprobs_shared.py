"""n sequences with prompt log-probabilities prefill the prompt once (issue 40 item 2): the
group's prompt logprobs are sequence 0's; the other sequences take the prompt from the prefix
cache instead of each computing it again.

Oracles: the same request with n=1 (prompt logprobs and each sequence's greedy tokens); the
prompt tokens the scheduler handed out (n=4 used to schedule the prompt 4 times).
"""

from __future__ import annotations

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import (
    assert_all_free,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
)

PROMPT_LEN = 200


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def _run(model, path, n: int) -> tuple[object, int]:
    engine = make_engine(model, path, max_num_batched_tokens=64)
    schedule = engine.scheduler.schedule
    scheduled = []

    def counting(*args, **kw):
        out = schedule(*args, **kw)
        scheduled.append(out.total_num_tokens)
        return out

    engine.scheduler.schedule = counting
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, n=n, prompt_logprobs=2)
    engine.add_request("r", prompt_ids(PROMPT_LEN, 7, model.config.vocab_size), params)
    out = run_all(engine)["r"]
    assert_all_free(engine)
    return out, sum(scheduled)


def test_n_sequences_share_one_prefill_and_its_prompt_logprobs(kimi):
    model, path = kimi
    solo, solo_tokens = _run(model, path, n=1)
    group, group_tokens = _run(model, path, n=4)
    assert len(group.prompt_logprobs) == len(solo.prompt_logprobs) == PROMPT_LEN
    for got, want in zip(group.prompt_logprobs[1:], solo.prompt_logprobs[1:], strict=True):
        assert got.keys() == want.keys()
        assert all(abs(got[t] - want[t]) <= 1e-5 for t in got)
    assert [o.token_ids for o in group.outputs] == [solo.outputs[0].token_ids] * 4
    # the prompt once, plus per other sequence its last block at most and its decodes
    assert group_tokens <= solo_tokens + 3 * (16 + 3), (group_tokens, solo_tokens)
