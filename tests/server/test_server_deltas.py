"""The server streams the engine's deltas as they come (no diffing of cumulative text): per
choice, the streamed pieces joined equal the JSON answer of the same seeded request (the
oracle), for n > 1, stop strings and logprobs, and no chunk repeats a token or a finish."""

from __future__ import annotations

import pytest

from tests.server.conftest import MODEL

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Tell me a story"}]


def _stop_from(text: str) -> str:
    assert len(text) > 12, text
    return text[len(text) // 2 : len(text) // 2 + 3]


@pytest.mark.parametrize("with_stop", [False, True], ids=["length", "stop-string"])
def test_streamed_completions_join_to_the_json_answer(server, with_stop):
    client = server.client()
    kw = dict(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=20,
        temperature=1.0,
        seed=3,
        n=2,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    if with_stop:
        kw["stop"] = [_stop_from(client.completions.create(**kw).choices[1].text)]
    whole = client.completions.create(**kw)
    chunks = [c for c in client.completions.create(**kw, stream=True) if c.choices]
    for want in whole.choices:
        pieces = [c.choices[0] for c in chunks if c.choices[0].index == want.index]
        assert "".join(p.text for p in pieces) == want.text
        assert [p.finish_reason for p in pieces][-1] == want.finish_reason
        assert all(p.finish_reason is None for p in pieces[:-1])
        for key in ("tokens", "token_logprobs", "text_offset", "top_logprobs"):
            streamed = [x for p in pieces for x in getattr(p.logprobs, key)]
            assert streamed == getattr(want.logprobs, key), key
    if with_stop:
        assert any(c.finish_reason == "stop" for c in whole.choices)


@pytest.mark.parametrize("with_stop", [False, True], ids=["length", "stop-string"])
def test_streamed_chat_joins_to_the_json_answer(server, with_stop):
    client = server.client()
    kw = dict(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=20,
        temperature=1.0,
        seed=5,
        n=3,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    if with_stop:
        kw["stop"] = [_stop_from(client.chat.completions.create(**kw).choices[2].message.content)]
    whole = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    usage = chunks[-1].usage
    assert usage.completion_tokens == whole.usage.completion_tokens
    for want in whole.choices:
        pieces = [ch for c in chunks for ch in c.choices if ch.index == want.index][1:]  # role
        assert "".join(p.delta.content or "" for p in pieces) == want.message.content
        assert [p.finish_reason for p in pieces][-1] == want.finish_reason
        assert all(p.finish_reason is None for p in pieces[:-1])
        streamed = [t for p in pieces if p.logprobs for t in p.logprobs.content]
        assert streamed == want.logprobs.content
    if with_stop:
        assert any(c.finish_reason == "stop" for c in whole.choices)
