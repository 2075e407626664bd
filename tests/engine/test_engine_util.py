"""The GPU tests' tolerant comparison (`assert_close_completion`) accepts what rounding may
change and nothing else: checked on hand-made outputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.engine.engine_util import assert_close_completion


def _out(ids: list[int], logprobs: list[dict[int, float]]) -> SimpleNamespace:
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs)])


WANT = _out([1, 2], [{1: -0.5, 7: -1.0, 8: -2.0}, {2: -0.1, 3: -3.0, 4: -3.5}])


def test_accepts_rounding_and_a_swap_at_the_tail() -> None:
    got = _out([1, 2], [{1: -0.5005, 7: -1.0, 9: -2.001}, {2: -0.1, 3: -3.0, 4: -3.5}])
    assert_close_completion(got, WANT, atol=2e-3)


def test_accepts_parting_after_a_near_tie() -> None:
    want = _out([1, 2], [{1: -0.7, 7: -0.701, 8: -2.0}, {2: -0.1, 3: -3.0, 4: -3.5}])
    got = _out([1, 5], [{1: -0.7, 7: -0.701, 8: -2.0}, {5: -0.2, 6: -3.0, 4: -3.5}])
    assert_close_completion(got, want, atol=2e-3)


@pytest.mark.parametrize(
    "got",
    [
        _out([1, 3], [{1: -0.5, 7: -1.0, 8: -2.0}, {3: -0.1, 2: -3.0, 4: -3.5}]),  # other token
        _out([1, 2], [{1: -0.6, 7: -1.0, 8: -2.0}, {2: -0.1, 3: -3.0, 4: -3.5}]),  # logprob off
        _out([1, 2], [{1: -0.5, 7: -1.0, 9: -1.5}, {2: -0.1, 3: -3.0, 4: -3.5}]),  # new candidate
        _out([1], [{1: -0.5, 7: -1.0, 8: -2.0}]),  # shorter
    ],
)
def test_refuses_real_differences(got) -> None:
    with pytest.raises(AssertionError):
        assert_close_completion(got, WANT, atol=2e-3)
