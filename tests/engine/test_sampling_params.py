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


def test_huge_integer_parameters_become_floats_and_sample() -> None:
    """JSON integers beyond int64 (the server fuzz sent temperature 2**64) are stored as floats:
    torch cannot take such an int as a scalar, which ended a whole engine step."""
    import torch

    from hyla.engine.sampler import Sampler, SamplingRow

    params = SamplingParams(temperature=2**64, repetition_penalty=2**64, top_p=1, min_p=0)
    assert all(isinstance(getattr(params, f), float) for f in ("temperature", "top_p", "min_p",
                                                               "repetition_penalty"))  # fmt: skip
    row = SamplingRow(params, [1, 2], [3], (), torch.Generator().manual_seed(0))
    out = Sampler()(torch.randn(1, 50), [row])
    assert 0 <= out.token_ids[0] < 50
    with pytest.raises(SamplingParamsError, match="temperature: must be finite"):
        SamplingParams(temperature=2**1100)
