"""SamplingParams validation: every invalid value raises SamplingParamsError naming its field."""

from __future__ import annotations

import pytest

from hyla.request import (
    MAX_N,
    InvalidRequestError,
    SamplingParams,
    SamplingParamsError,
)

INVALID = [
    ("n", 0),
    ("n", MAX_N + 1),
    ("n", 1.5),
    ("best_of", 0),
    ("temperature", -0.1),
    ("temperature", float("nan")),
    ("temperature", "hot"),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_k", 2.5),
    ("min_p", -0.1),
    ("min_p", 1.5),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0),
    ("seed", 1.5),
    ("stop", [""]),
    ("stop", [3]),
    ("stop", 5),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", ["a"]),
    ("max_tokens", 0),
    ("max_tokens", -5),
    ("min_tokens", -1),
    ("logprobs", -1),
    ("logprobs", 21),
    ("prompt_logprobs", 21),
    ("prompt_logprobs", -2),
]


@pytest.mark.parametrize("name,value", INVALID, ids=[f"{n}={v!r}" for n, v in INVALID])
def test_invalid_field_is_named(name, value):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**{name: value})
    assert e.value.field == name
    assert str(e.value).startswith(f"{name}: ")
    assert isinstance(e.value, InvalidRequestError) and isinstance(e.value, ValueError)


def test_cross_field_limits():
    with pytest.raises(SamplingParamsError, match="best_of") as e:
        SamplingParams(n=3, best_of=2)
    assert e.value.field == "best_of"
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(min_tokens=5, max_tokens=4)
    assert e.value.field == "min_tokens" and "max_tokens=4" in e.value.message


def test_defaults_and_conversions():
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[3, 4])
    assert p.stop == ("a", "b") and p.stop_token_ids == (3, 4)
    assert SamplingParams(stop="x").stop == ("x",)
    d = SamplingParams()
    assert (d.n, d.temperature, d.top_p, d.top_k, d.max_tokens) == (1, 1.0, 1.0, 0, 16)
    assert SamplingParams(temperature=0).is_greedy and SamplingParams(top_k=1).is_greedy
    assert SamplingParams(max_tokens=None, top_k=-1).max_tokens is None
    assert SamplingParams(n=2, best_of=4).num_sequences == 4
    hash(p)  # frozen


def test_tiny_temperature_is_clamped_not_degenerate():
    from hyla.request import MIN_TEMPERATURE

    assert SamplingParams(temperature=1e-320).temperature == MIN_TEMPERATURE
    assert SamplingParams(temperature=0).temperature == 0
