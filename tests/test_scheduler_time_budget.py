"""The step time budget (`max_step_seconds`): while a request decodes, a long prefill's chunk
is cut to what the measured seconds per token allow (no torch, synthetic step times).

Oracle: the budget's arithmetic, `max_step_seconds / seconds_per_token` tokens per step.
"""

from __future__ import annotations

import pytest

from hyla.scheduler import MIN_PREFILL_TOKENS, PROBE_TOKENS
from tests.test_scheduler import make, req, run_step


def _decoding_and_long(s, long_prompt: int = 4000):
    s.add_request(req("d", 4, max_tokens=100))
    run_step(s)  # d's prompt, then its first token: d is decoding
    assert s.requests["d"].num_output_tokens == 1
    s.add_request(req("long", long_prompt, max_tokens=1))


def test_a_prefill_beside_a_decoding_stream_gets_the_time_budgets_tokens():
    s = make(num_blocks=2048, max_num_batched_tokens=2048, max_step_seconds=0.05)
    _decoding_and_long(s)
    s.observe_step(1000, 1.0)  # 1 ms per token: 50 tokens per 0.05 s step
    out = s.schedule()
    assert out.num_scheduled_tokens == {"d": 1, "long": 49}


def test_the_budget_follows_the_recent_cost_per_token():
    s = make(num_blocks=2048, max_num_batched_tokens=2048, max_step_seconds=0.1)
    _decoding_and_long(s)
    s.observe_step(1000, 1.0)
    s.observe_step(1000, 3.0)  # context grew: 3 ms per token now, averaged to 2 ms
    assert s.schedule().total_num_tokens == 50


def test_before_any_measurement_a_prefill_beside_a_decode_is_a_probe():
    s = make(num_blocks=2048, max_num_batched_tokens=2048, max_step_seconds=1.0)
    _decoding_and_long(s)
    assert s.schedule().total_num_tokens == PROBE_TOKENS


def test_a_prefill_alone_keeps_the_whole_token_budget():
    s = make(num_blocks=2048, max_num_batched_tokens=2048, max_step_seconds=0.05)
    s.observe_step(1000, 1.0)
    s.add_request(req("long", 4000, max_tokens=1))
    assert s.schedule().num_scheduled_tokens == {"long": 2048}


@pytest.mark.parametrize("limit", [0.0, 1e-6], ids=["off", "tiny"])
def test_off_or_tiny_budgets(limit):
    s = make(num_blocks=2048, max_num_batched_tokens=2048, max_step_seconds=limit)
    _decoding_and_long(s)
    s.observe_step(1000, 1.0)
    n = s.schedule().total_num_tokens
    assert n == (2048 if limit == 0 else 1 + MIN_PREFILL_TOKENS)  # tiny: the floor


def test_short_steps_are_not_measured():
    s = make(max_step_seconds=1.0)
    s.observe_step(1, 0.5)  # a decode step: fixed cost, not tokens
    assert s.seconds_per_token is None
