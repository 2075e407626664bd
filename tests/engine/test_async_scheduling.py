"""Async scheduling (a greedy step stays on the device while the next one is scheduled and
launched; its tokens are placeholders on the host until read) against the synchronous engine,
on stops decided by the in-flight token itself: a stop token id on the last token max_tokens
allows must end the request with reason "stop" (stop ids are checked before the length, as the
synchronous engine checks them on the same token), a stop token met mid-stream ends only its
own request, and min_tokens keeps a stop token from ending it. See test_async_output for the
shared scenarios (aborts, prefix caching, preemption) that run in all three modes.
"""

from __future__ import annotations

import pytest

from hyla.config import ConfigError, EngineConfig
from hyla.request import SamplingParams
from tests.engine.engine_util import make_engine, prompt_ids, run_all
from tests.engine.test_async_output import compare, drive


def _greedy_tokens(model, path, prompt: list[int], n: int) -> list[int]:
    engine = make_engine(model, path, async_output=False)
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    engine.add_request("probe", prompt, params)
    return run_all(engine)["probe"].outputs[0].token_ids


def test_stop_tokens_decided_by_in_flight_tokens(kimi):
    model, path = kimi
    vocab = model.config.vocab_size
    prompt = prompt_ids(12, 41, vocab)
    tokens = _greedy_tokens(model, path, prompt, 8)
    last, mid = tokens[7], tokens[3]
    greedy = dict(temperature=0, ignore_eos=True)
    requests = {
        # the 8th token is a stop id and the 8th is the last allowed: "stop", not "length"
        "last": (prompt, SamplingParams(max_tokens=8, stop_token_ids=[last], **greedy)),
        "mid": (prompt, SamplingParams(max_tokens=8, stop_token_ids=[mid], **greedy)),
        "min": (
            prompt,
            SamplingParams(max_tokens=8, stop_token_ids=[mid], min_tokens=6, **greedy),
        ),  # fmt: skip
        "other": (prompt_ids(7, 42, vocab), SamplingParams(max_tokens=12, **greedy)),
    }
    engines = compare(model, path, lambda e: drive(e, requests))  # the three modes agree
    assert engines[2].num_inflight_steps > 0
    sync = make_engine(model, path, async_output=False)
    out, _ = drive(sync, requests)
    assert tokens.index(last) == 7  # the scenario: the stop id first comes as the 8th token
    assert out["last"].outputs[0].finish_reason == "stop"
    assert out["last"].outputs[0].stop_reason == last
    assert out["last"].outputs[0].token_ids == tokens
    assert out["min"].outputs[0].finish_reason == "length"
    assert out["mid"].outputs[0].token_ids == tokens[: tokens.index(mid) + 1]
    assert len(out["other"].outputs[0].token_ids) == 12


def test_async_scheduling_needs_async_output():
    with pytest.raises(ConfigError, match="async_scheduling"):
        EngineConfig.from_kwargs(async_output=False, async_scheduling=True)
    assert EngineConfig.from_kwargs(async_scheduling=True).async_scheduling is True


def test_rows_ended_while_waiting_before_a_launch_are_dropped(kimi, monkeypatch):
    """The fallback when a scheduled row cannot take its input from the device (the engine
    reads the in-flight tokens before building the step): forced at every step, requests that
    those tokens end (stop token ids) leave the already scheduled step instead of running on
    released cache; outputs equal the synchronous engine's."""
    from hyla.engine.inflight import InflightStep

    model, path = kimi
    vocab = model.config.vocab_size
    prompt = prompt_ids(12, 41, vocab)
    tokens = _greedy_tokens(model, path, prompt, 8)
    greedy = dict(temperature=0, ignore_eos=True)
    requests = {
        "mid": (prompt, SamplingParams(max_tokens=8, stop_token_ids=[tokens[3]], **greedy)),
        "other": (prompt_ids(7, 42, vocab), SamplingParams(max_tokens=12, **greedy)),
    }
    monkeypatch.setattr(InflightStep, "device_tokens", lambda self, out, requests: None)
    engines = compare(model, path, lambda e: drive(e, requests))
    assert engines[2].num_inflight_steps > 0
