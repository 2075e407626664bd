"""Prompt validation: one vectorised check per prompt (the oracle: the per-id definition,
every id an int, not a bool, in [0, vocab)), and checked ids are not checked again."""

from __future__ import annotations

import pytest

import hyla.engine.validate as validate
from hyla.engine.validate import TokenIds, prompt_token_ids
from hyla.request import InvalidRequestError


@pytest.mark.parametrize(
    "ids,message",
    [
        ([], "must not be empty"),
        ([1, True], "must be integers, got True"),
        ([1, 2.0], "must be integers, got 2.0"),
        ([1, "3"], "must be integers, got '3'"),
        ([3, -1, 7], "token id -1 not in [0, 100)"),
        ([3, 100], "token id 100 not in [0, 100)"),
        ([2**70], "token ids must be in [0, 100)"),
    ],
)
def test_bad_ids_are_named(ids, message):
    with pytest.raises(InvalidRequestError, match="prompt") as e:
        prompt_token_ids(ids, None, 100)
    assert message in str(e.value)


def test_ids_are_checked_once(monkeypatch):
    ids = prompt_token_ids(list(range(100)) * 50, None, 100)
    assert isinstance(ids, TokenIds) and ids == list(range(100)) * 50
    calls = []
    monkeypatch.setattr(validate, "_check_ids", lambda *a: calls.append(a))
    assert prompt_token_ids(ids, None, 100) is ids and calls == []
    prompt_token_ids(ids, None, 50)  # another vocabulary: checked again
    assert len(calls) == 1
