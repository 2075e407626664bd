"""The tokenizer pool (`hyla/server/tokenizer_pool.py`, issue 18 item 4): large bodies are
validated, rendered and tokenized in a worker process.

Oracle: the in-process path of the same code. Token ids and errors of the pool equal
`convert.chat_prompt_ids` / `convert.normalize_prompts` run here; a server that sends every body
to the pool answers as one without a pool (same weights, greedy), errors included.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from hyla.cache.prefix import extend_block_hashes
from hyla.server import convert, tokenizer_pool
from hyla.server.errors import APIError
from hyla.server.protocol import ChatCompletionRequest, CompletionRequest
from hyla.server.tokenizer_pool import Outcome, PoolGaveUp, TokenizerPool
from tests.server.conftest import MODEL

BLOCK = 16
# A template that reads names, a kwarg and the generation prompt, so each reaches the render.
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}{% if m.name %} {{ m.name }}{% endif %}>"
    "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    "{% if brief %} (brief){% endif %}"
)
USER = {"role": "user", "content": "Hello there, how are you?"}
CHATS = {
    "plain": {"messages": [{"role": "system", "content": "Be brief."}, USER]},
    "multi_turn": {
        "messages": [USER, {"role": "assistant", "content": "Fine."}, USER],
        "add_generation_prompt": False,
    },
    "name_and_kwargs": {
        "messages": [{**USER, "name": "ann"}],
        "chat_template_kwargs": {"brief": True},
    },
    "text_parts": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}],
            }
        ]
    },
    "developer_role": {"messages": [{"role": "developer", "content": "x"}, USER]},
    "long": {"messages": [{"role": "user", "content": "many words " * 60}]},
    "image_on_text_model": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                ],
            }
        ]
    },
    "unknown_role": {"messages": [{"role": "robot", "content": "x"}]},
    "empty": {"messages": []},
    "reserved_kwarg": {"messages": [USER], "chat_template_kwargs": {"tokenize": True}},
    "unread_kwarg": {"messages": [USER], "chat_template_kwargs": {"colour": "red"}},
    "lone_surrogate": {"messages": [{"role": "user", "content": "a\ud800"}]},
}
COMPLETIONS = {
    "ids": [5, 6, 7, 8],
    "ids_long": list(range(5, 45)),
    "id_batch": [[5, 6], [7, 8, 9]],
    "text": "Once upon a time",
    "text_batch": ["a", "b c"],
    "id_out_of_vocab": [5, 10**9],
    "negative_id": [[5], [-1]],
    "empty_list": [],
}


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except APIError as e:
        return "error", (e.status, e.message, e.param, e.code)


@pytest.fixture(scope="module")
def template_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def pool(template_tokenizer):
    pool = TokenizerPool(template_tokenizer, size=1, min_bytes=0)
    yield pool
    pool.close()


@pytest.mark.parametrize("name", list(CHATS))
def test_pooled_chat_equals_in_process(pool, template_tokenizer, name):
    body = {"model": MODEL, **CHATS[name]}
    vocab = len(template_tokenizer)
    req = ChatCompletionRequest.model_validate(body)
    expected = _outcome(lambda: convert.chat_prompt_ids(template_tokenizer, req))
    outcome = asyncio.run(pool.prepare_chat(json.dumps(body).encode(), vocab, BLOCK))
    assert outcome.errors is None
    got = _outcome(lambda: outcome.prompt_list(vocab)[0])
    assert got == expected
    if name in ("plain", "multi_turn", "name_and_kwargs", "text_parts", "developer_role", "long"):
        assert got[0] == "ok" and len(got[1]) > 3
        assert got[1].block_hashes == extend_block_hashes([], expected[1], BLOCK)
        assert len(got[1].block_hashes) == len(got[1]) // BLOCK


@pytest.mark.parametrize("name", list(COMPLETIONS))
def test_pooled_completion_equals_in_process(pool, tokenizer, name):
    body = {"model": MODEL, "prompt": COMPLETIONS[name]}
    vocab = len(tokenizer)
    req = CompletionRequest.model_validate(body)
    expected = _outcome(lambda: convert.normalize_prompts(req.prompt))
    outcome = asyncio.run(pool.prepare_completion(json.dumps(body).encode(), vocab, BLOCK))
    got = _outcome(lambda: outcome.prompt_list(vocab))
    assert got == expected
    if name in ("ids", "ids_long", "id_batch"):  # checked in the worker: the engine skips it
        assert all(getattr(p, "vocab_size", None) == vocab for p in got[1])
        assert [p.block_hashes for p in got[1]] == [
            extend_block_hashes([], p, BLOCK) for p in expected[1]
        ]
    if name == "id_out_of_vocab":  # not checked: the engine refuses it with its own error
        assert not hasattr(got[1][0], "vocab_size")


def test_pooled_validation_errors_equal_fastapis(pool):
    """The worker's pydantic errors are FastAPI's (under "body"), so the 422/400 is the same."""
    from pydantic import ValidationError

    body = {
        "model": MODEL,
        "messages": [{"role": 3}, {"content": "x", "foo": 1}],
        "temperature": "hot",
    }
    outcome = asyncio.run(pool.prepare_chat(json.dumps(body).encode(), None))
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate(body)
    expected = [{**err, "loc": ("body", *err["loc"])} for err in e.value.errors(include_url=False)]
    assert outcome.errors == expected


def _plain_chat(pool: TokenizerPool, tok: Any) -> None:
    """A request the pool prepares as the in-process path does (it serves)."""
    body = {"model": MODEL, **CHATS["plain"]}
    expected = convert.chat_prompt_ids(tok, ChatCompletionRequest.model_validate(body))
    outcome = asyncio.run(pool.prepare_chat(json.dumps(body).encode(), len(tok), BLOCK))
    assert outcome.prompt_list(len(tok))[0] == expected


def _pool_error(awaitable: Any) -> APIError:
    with pytest.raises(APIError) as e:
        asyncio.run(awaitable)
    assert (e.value.status, e.value.code) == (503, "tokenizer_pool_failed")
    assert e.value.headers == {"Retry-After": "1"}
    return e.value


def test_a_hung_worker_times_out_and_its_pool_is_replaced(template_tokenizer):
    """A worker that never finishes: its request gets the retryable 503 after `timeout` s
    (not never), the hung worker is killed, and the requests queued behind it (one already in
    the executor's call queue, one still in its pending queue) are prepared by a new pool, not
    failed (with a 503, or a cancellation the server answered "shutting down")."""
    pool = TokenizerPool(template_tokenizer, size=1, min_bytes=0)
    try:
        _plain_chat(pool, template_tokenizer)  # workers ready (spawn takes seconds here)
        [pid] = pool.worker_pids()
        pool.timeout = 1.0
        body = {"model": MODEL, **CHATS["plain"]}
        expected = convert.chat_prompt_ids(template_tokenizer,
                                           ChatCompletionRequest.model_validate(body))

        async def hung() -> Any:
            try:
                return await pool.run(time.sleep, 60)
            finally:
                pool.timeout = 60.0  # the new pool's spawn takes seconds here

        async def hung_and_queued() -> list[Any]:
            queued = [pool.prepare_chat(json.dumps(body).encode(), None) for _ in range(2)]
            return await asyncio.gather(hung(), *queued, return_exceptions=True)

        start = time.monotonic()
        error, *outcomes = asyncio.run(hung_and_queued())
        assert time.monotonic() - start < 60
        assert isinstance(error, APIError), error
        assert (error.status, error.code) == (503, "tokenizer_pool_failed")
        assert "within 1 s" in error.message
        for outcome in outcomes:
            assert isinstance(outcome, Outcome), outcome
            assert outcome.prompt_list(None)[0] == expected
        assert pid not in pool.worker_pids() and not pool.gave_up
        time.sleep(0.5)
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid), "hung worker left running"
    finally:
        pool.close()


def test_a_worker_dead_while_idle_does_not_fail_the_next_request(template_tokenizer):
    """A worker killed between requests (e.g. by the OOM killer) is not the next request's
    doing: that request is prepared by a new pool."""
    pool = TokenizerPool(template_tokenizer, size=1, min_bytes=0)
    try:
        _plain_chat(pool, template_tokenizer)
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid in pool.worker_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the executor's manager thread marks the pool broken
        _plain_chat(pool, template_tokenizer)
        assert pid not in pool.worker_pids() and pool.worker_pids() and not pool.gave_up
    finally:
        pool.close()


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_pools_that_keep_failing_give_up_for_in_process(template_tokenizer):
    """`max_failures` pools failed in a row: the pool gives up (the request that made it is
    prepared in-process: `prepare_*` answers None) and takes no body any more."""
    pool = TokenizerPool(template_tokenizer, size=1, min_bytes=0, max_failures=2)
    try:
        _plain_chat(pool, template_tokenizer)
        _pool_error(pool.run(os._exit, 1))  # a worker dies: 503, a new pool
        assert not pool.gave_up and pool.wants(1)
        with pytest.raises(PoolGaveUp):
            asyncio.run(pool.run(os._exit, 1))
        assert pool.gave_up and not pool.wants(1 << 20) and pool.worker_pids() == []
        body = json.dumps({"model": MODEL, **CHATS["plain"]}).encode()
        assert asyncio.run(pool.prepare_chat(body, None)) is None
    finally:
        pool.close()


def _refuse_to_start(tokenizer: Any) -> None:
    """A worker initializer that fails, as when the tokenizer does not load in the worker."""
    raise RuntimeError("no tokenizer here")


# -- the server with a pool against the server without -------------------------------------------


@pytest.fixture(scope="module")
def pair(make_server):
    """(pooled, plain): the same weights; `pooled` sends every body to its pool."""
    pooled = make_server(tokenizer_pool_size=1, tokenizer_pool_min_bytes=0)
    plain = make_server()
    return pooled, plain


def _answer(server, path: str, body: dict) -> tuple[int, Any]:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    data = r.json()
    for key in ("id", "created"):
        data.pop(key, None)
    return r.status_code, data


LONG = [{"role": "user", "content": "hello world " * 10}] * 30  # > 256 tokens once rendered
CHAT_BODIES = {
    "greedy": {
        "messages": [USER],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    },
    "too_long_rendered": {"messages": LONG, "max_tokens": 1},
    "max_tokens_past_window": {"messages": [USER], "max_completion_tokens": 250},
    "schema_error": {"messages": [{"role": "user", "content": 5}], "temperature": "hot"},
    "extra_field": {"messages": [{**USER, "foo": 1}]},
    "tools": {"messages": [USER], "tools": [{"type": "function", "function": {"name": "f"}}]},
    "image_on_text_model": CHATS["image_on_text_model"],
    "name_unused": {"messages": [{**USER, "name": "ann"}]},
    "unknown_model": {"messages": [USER], "model": "other"},
}
COMPLETION_BODIES = {
    "echo_logprobs": {
        "prompt": [5, 6, 7],
        "max_tokens": 3,
        "temperature": 0,
        "echo": True,
        "logprobs": 1,
    },
    "batch": {"prompt": [[5, 6], "Once upon"], "max_tokens": 2, "temperature": 0},
    "out_of_vocab": {"prompt": [5, 10**9], "max_tokens": 1},
    "too_long": {"prompt": [5] * 200, "max_tokens": 100},
    "schema_error": {"prompt": [5, "x"]},
    "suffix": {"prompt": [5], "suffix": "x"},
}


@pytest.mark.parametrize("name", list(CHAT_BODIES))
def test_pooled_server_chat_answers_as_in_process(pair, name):
    pooled, plain = pair
    body = {"model": MODEL, **CHAT_BODIES[name]}
    assert _answer(pooled, "/v1/chat/completions", body) == _answer(
        plain, "/v1/chat/completions", body
    )


@pytest.mark.parametrize("name", list(COMPLETION_BODIES))
def test_pooled_server_completion_answers_as_in_process(pair, name):
    pooled, plain = pair
    body = {"model": MODEL, **COMPLETION_BODIES[name]}
    assert _answer(pooled, "/v1/completions", body) == _answer(plain, "/v1/completions", body)


def _sized_chat(num_bytes: int) -> bytes:
    """A chat body of exactly `num_bytes` (JSON padded with trailing spaces)."""
    body = json.dumps({"model": MODEL, "messages": [USER], "max_tokens": 1}).encode()
    assert len(body) <= num_bytes
    return body + b" " * (num_bytes - len(body))


def test_threshold_boundary(pair, monkeypatch):
    pooled, _ = pair
    pool = pooled.server.config.app.state.ctx.pool
    calls = []
    real = pool.prepare_chat

    async def spy(body: bytes, *args: Any) -> Any:
        calls.append(len(body))
        return await real(body, *args)

    monkeypatch.setattr(pool, "prepare_chat", spy)
    monkeypatch.setattr(pool, "min_bytes", 300)
    for size in (299, 300, 301):
        r = httpx.post(
            f"{pooled.url}/v1/chat/completions",
            content=_sized_chat(size),
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    assert calls == [300, 301]


def test_killed_worker_fails_its_request_and_the_next_works(pair):
    """A worker killed mid-request: that request gets a 503 naming the pool (retryable), the
    pool is replaced and the next request is served."""
    pooled, _ = pair
    pool = pooled.server.config.app.state.ctx.pool
    [pid] = pool.worker_pids()
    text = "many words " * 400_000  # ~4 MB to tokenize: seconds in the worker
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    answers: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{pooled.url}/v1/chat/completions", json=body, timeout=120)
        )
    )
    sender.start()
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    sender.join(120)
    r = answers[0]
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "tokenizer_pool_failed"
    assert r.headers["retry-after"] == "1"
    ok = {"model": MODEL, "messages": [USER], "max_tokens": 2}
    r = httpx.post(f"{pooled.url}/v1/chat/completions", json=ok, timeout=120)
    assert r.status_code == 200, r.text
    assert pid not in pool.worker_pids() and pool.worker_pids()


def test_server_stop_leaves_no_pool_process(make_server):
    server = make_server(tokenizer_pool_size=2, tokenizer_pool_min_bytes=0)
    pool = server.server.config.app.state.ctx.pool
    r = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": MODEL, "prompt": [5, 6], "max_tokens": 1},
        timeout=60,
    )
    assert r.status_code == 200
    pids = pool.worker_pids()
    assert pids
    server.stop()
    assert not server.thread.is_alive()
    assert pool.worker_pids() == []
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"pool worker {pid} left behind"


def test_a_pool_that_cannot_start_leaves_the_server_without_one(make_server, monkeypatch):
    def refuse(self: TokenizerPool) -> None:
        raise OSError("no processes here")

    monkeypatch.setattr(TokenizerPool, "start", refuse)
    server = make_server(tokenizer_pool_size=1, tokenizer_pool_min_bytes=0)
    assert server.server.config.app.state.ctx.pool is None
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [USER], "max_tokens": 2})  # fmt: skip
    assert r.status_code == 200, r.text


def test_a_pool_whose_workers_cannot_start_serves_in_process(
    make_server, pair, monkeypatch, caplog
):
    """Workers whose initializer raises: large requests are answered as by the server without
    a pool (not a 503 each), and the pool's giving up is logged once."""
    monkeypatch.setattr(tokenizer_pool, "_init_worker", _refuse_to_start)
    broken = make_server(tokenizer_pool_size=1, tokenizer_pool_min_bytes=0)
    pool = broken.server.config.app.state.ctx.pool
    _, plain = pair
    caplog.set_level("ERROR", logger="hyla.server")
    for name in ("greedy", "schema_error", "too_long_rendered"):
        body = {"model": MODEL, **CHAT_BODIES[name]}
        got = _answer(broken, "/v1/chat/completions", body)
        assert got == _answer(plain, "/v1/chat/completions", body)
    body = {"model": MODEL, **COMPLETION_BODIES["echo_logprobs"]}
    assert _answer(broken, "/v1/completions", body) == _answer(plain, "/v1/completions", body)
    assert pool.gave_up and pool.worker_pids() == []
    gave_up = [r for r in caplog.records if "in-process from now on" in r.getMessage()]
    assert len(gave_up) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain+json",
        "application/a/b+json",
        "application/json",
        "Application/JSON; charset=utf-8",
    ],
)
def test_the_pool_reads_a_body_as_json_exactly_when_fastapi_does(pair, content_type):
    """FastAPI parses a body as JSON only for an application/json or application/*+json
    content type; for another (text/plain+json) it validates the bytes, and the pooled server
    must answer the same 422 as the plain one, not the errors of the body read as JSON."""
    body = json.dumps({"model": MODEL, **CHAT_BODIES["schema_error"]}).encode()
    answers = []
    for server in pair:
        r = httpx.post(f"{server.url}/v1/chat/completions", content=body,
                       headers={"content-type": content_type}, timeout=60)  # fmt: skip
        answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1]
    assert answers[0][0] == 422
