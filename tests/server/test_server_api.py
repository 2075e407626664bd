"""The OpenAI API end to end: a real uvicorn server driven by the official `openai` client.

Oracle: the same tiny engine run directly (`LLMEngine.step()` loop, no server), so the server
must neither change tokens nor lose text; plus the OpenAI response shapes the client parses.
"""

from __future__ import annotations

import json

import httpx
import pytest

from hyla.request import SamplingParams
from tests.server.conftest import MODEL, tiny_engine

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def direct(tokenizer):
    """Run prompts on a separate, identical engine without the server."""
    engine = tiny_engine(tokenizer)

    def run(prompt, **params):
        engine.add_request("r", prompt, SamplingParams(**params))
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                final = out
        return final

    return run


def test_models_lists_served_model(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_matches_direct_engine(server, direct):
    r = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=6,
                                           temperature=0)
    want = direct(PROMPT, max_tokens=6, temperature=0)
    assert r.choices[0].text == want.outputs[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_token_id_prompt_and_batch(server, tokenizer, direct):
    ids = tokenizer(PROMPT)["input_ids"]
    client = server.client()
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    assert r.choices[0].text == direct(ids, max_tokens=4, temperature=0).outputs[0].text
    batch = client.completions.create(model=MODEL, prompt=[PROMPT, "Hi", PROMPT], max_tokens=4,
                                      temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert batch.choices[0].text == batch.choices[2].text == r.choices[0].text


def test_echo_and_logprobs(server, tokenizer):
    r = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=3,
                                           temperature=0, echo=True, logprobs=2)
    choice = r.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    num_prompt = len(tokenizer(PROMPT)["input_ids"])
    assert len(lp.tokens) == len(lp.token_logprobs) == num_prompt + 3
    assert lp.token_logprobs[0] is None
    for logprob, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
        assert logprob <= 0 and 1 <= len(top) <= 2
    # Greedy: each generated token is the most likely one.
    for token, logprob, top in zip(lp.tokens[-3:], lp.token_logprobs[-3:], lp.top_logprobs[-3:],
                                   strict=True):
        assert max(top.values()) == pytest.approx(logprob)
        assert top[token] == pytest.approx(logprob)


def test_seed_makes_sampling_reproducible(server):
    client = server.client()
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=1234)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text
    c = client.completions.create(**{**kw, "seed": 99})
    assert c.choices[0].text != a.choices[0].text


def test_n_choices(server):
    r = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=3,
                                           temperature=1.0, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 12
    assert len({c.text for c in r.choices}) > 1


def test_stop_string_ends_text(server, direct):
    full = direct(PROMPT, max_tokens=8, temperature=0).outputs[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    r = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                           temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text
    assert full.startswith(r.choices[0].text)


def test_chat_uses_tokenizer_template(server, tokenizer, direct):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    r = server.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=5,
                                                temperature=0)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    want = direct(ids, max_tokens=5, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.outputs[0].text
    assert r.usage.prompt_tokens == len(ids)


def test_chat_default_template_when_tokenizer_has_none(server, monkeypatch):
    from hyla.server.convert import default_chat_prompt

    monkeypatch.setattr(server.engine.tokenizer, "chat_template", None)
    r = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"
    prompt = default_chat_prompt([{"role": "user", "content": "Hi!"}], True)
    assert prompt == "User: Hi!\nAssistant:"


def test_chat_logprobs(server):
    r = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == pytest.approx(t.logprob)


def test_streaming_completion_equals_non_streaming(server):
    client = server.client()
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_streaming_chat_with_usage_and_n(server):
    chunks = list(server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
        n=2, stream=True, stream_options={"include_usage": True}))
    assert {c.choices[0].delta.role for c in chunks[:1]} == {"assistant"}
    texts = {0: "", 1: ""}
    for c in chunks[:-1]:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts[0] == texts[1] != ""
    assert chunks[-1].usage.completion_tokens == 8


def test_sse_wire_format_ends_with_done(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_chat_sse_deltas_carry_role_once_and_no_nulls(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line[6:].startswith("{")]
    deltas = [c["choices"][0]["delta"] for c in events if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all("role" not in d and None not in d.values() for d in deltas[1:])
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_health_and_metrics(server):
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    # read to the end: the request is counted when its response completes (unread, the counter
    # line existed only if an earlier test of this module had finished a completion)
    list(server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, stream=True))
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("hyla_http_requests_total{route=\"/v1/completions\",status=\"200\"}",
                 "hyla_time_to_first_token_seconds_bucket", "hyla_inter_token_latency_seconds",
                 "hyla_num_requests_running", "hyla_num_requests_waiting",
                 "hyla_cache_block_usage_ratio", "hyla_state_slot_usage_ratio"):
        assert name in text, name
    steps = {path: float(line.split()[-1]) for line in text.splitlines()
             for path in ("decode_graph", "mixed_graph", "eager")
             if line.startswith(f'hyla_engine_steps_total{{path="{path}"}}')}  # fmt: skip
    assert set(steps) == {"decode_graph", "mixed_graph", "eager"} and steps["eager"] >= 2
    assert steps["decode_graph"] == steps["mixed_graph"] == 0  # the CPU runs steps eagerly
    assert 'hyla_engine_launch_seconds_total{path="eager"}' in text


def test_streaming_echo_and_logprobs_equal_non_streaming(server):
    client = server.client()
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=2)
    whole = client.completions.create(**kw).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text
    for key in ("tokens", "token_logprobs", "text_offset", "top_logprobs"):
        streamed = [x for c in chunks for x in getattr(c.logprobs, key)]
        assert streamed == getattr(whole.logprobs, key), key
