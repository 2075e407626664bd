"""Concurrency, cancellation, timeouts, back-pressure and graceful drain on a live server.

Oracles: each request's solo output (batch transparency, greedy), the engine's block and slot
counters (conservation: all free once every request ended or was cancelled).
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import openai
import pytest

from tests.server.conftest import MODEL


def _assert_all_free(server, timeout: float = 10.0) -> None:
    stats = server.wait_idle(timeout)
    assert stats.num_free_blocks == stats.num_total_blocks, stats
    assert stats.num_free_slots == stats.num_total_slots, stats
    assert stats.num_running == stats.num_waiting == 0, stats


def _finished(server, reason: str) -> float:
    """The server's count of requests finished with `reason` (from /metrics)."""
    key = f'hyla_requests_finished_total{{finish_reason="{reason}"}} '
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(key):
            return float(line.split()[-1])
    return 0.0


def _prompt(i: int) -> str:
    return f"Request {i}: " + " ".join(["lorem", "ipsum", "dolor"][: 1 + i % 3] * (1 + i % 5))


def test_32_concurrent_streams_equal_solo_outputs(server):
    client = server.client()
    solo = [
        client.completions.create(model=MODEL, prompt=_prompt(i), max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
        .choices[0].text
        for i in range(32)
    ]

    async def one(aclient, i: int) -> str:
        stream = await aclient.completions.create(model=MODEL, prompt=_prompt(i), max_tokens=8,
                                                  temperature=0, stream=True,
                                                  extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_streams() -> list[str]:
        aclient = server.async_client()
        try:
            return await asyncio.gather(*(one(aclient, i) for i in range(32)))
        finally:
            await aclient.close()

    assert asyncio.run(all_streams()) == solo
    _assert_all_free(server)


def test_cancel_mid_stream_frees_blocks_and_slots(server):
    client = server.client()
    streams = []
    for i in range(4):
        stream = client.completions.create(model=MODEL, prompt=_prompt(i), max_tokens=200,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        streams.append(stream)
    assert server.engine.get_stats().num_running == 4
    aborted, completed = _finished(server, "abort"), _finished(server, "length")
    for stream in streams:
        stream.close()
    _assert_all_free(server)
    assert _finished(server, "abort") == aborted + 4
    assert _finished(server, "length") == completed


def test_client_timeout_on_non_streaming_request_aborts_it(server):
    body = {"model": MODEL, "prompt": _prompt(1), "max_tokens": 200, "ignore_eos": True}
    aborted = _finished(server, "abort")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.3)
    _assert_all_free(server)
    assert _finished(server, "abort") == aborted + 1


def test_request_timeout_finish_reason(make_server):
    server = make_server(engine_options={"request_timeout": 0.4})
    client = server.client()
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=200,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "timeout"
    assert r.usage.completion_tokens < 200
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=200, stream=True,
        extra_body={"ignore_eos": True}))
    assert chunks[-1].choices[0].finish_reason == "timeout"
    _assert_all_free(server)


def test_full_queue_answers_503_with_retry_after(make_server):
    server = make_server(engine_options={"max_num_seqs": 1, "max_queue_len": 1})
    client = server.client()
    kw = dict(model=MODEL, prompt="Hi", max_tokens=200, stream=True,
              extra_body={"ignore_eos": True})
    running = client.completions.create(**kw)
    next(iter(running))
    waiting = client.completions.create(**kw)
    deadline = time.monotonic() + 5
    while server.engine.get_stats().num_waiting < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert e.value.status_code == 503
    assert int(e.value.response.headers["retry-after"]) >= 1
    assert "queue" in e.value.message
    running.close()
    waiting.close()
    _assert_all_free(server)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices


def test_engine_failure_is_a_500_not_a_crash(make_server, monkeypatch):
    server = make_server()
    real_step = server.engine.step
    monkeypatch.setattr(server.engine, "step", lambda: (_ for _ in ()).throw(RuntimeError("x")))
    client = server.client()
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    assert "engine step failed" in e.value.message
    with pytest.raises(openai.APIError):
        list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, stream=True))
    monkeypatch.setattr(server.engine, "step", real_step)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices
    _assert_all_free(server)


def test_sigterm_drains_in_flight_requests(make_server):
    server = make_server()
    client = server.client()
    stream = client.completions.create(model=MODEL, prompt="Hi", max_tokens=40, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = next(chunks)
    server.server.handle_exit(signal.SIGTERM, None)
    assert server.async_engine.is_draining
    rest = list(chunks)
    assert rest[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].text for c in [first, *rest])
    assert text
    server.thread.join(timeout=20)
    assert not server.thread.is_alive()
    assert not server.async_engine.is_running
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=2)


def test_engine_is_idle_after_a_failed_step(make_server, monkeypatch):
    """A step that raises ends its requests (aborted); the loop steps once more to collect
    them, so the engine holds no request afterwards without waiting for a new one (the server
    fuzz saw a group linger until the next request)."""
    server = make_server()
    sampler = server.engine.sampler
    real_launch = sampler.launch
    monkeypatch.setattr(sampler, "launch", lambda *a: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(openai.InternalServerError):
        server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    stats = server.wait_idle(timeout=10)
    assert not server.engine.has_unfinished_requests()
    assert stats.num_free_blocks == stats.num_total_blocks
    monkeypatch.setattr(sampler, "launch", real_launch)
    assert server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices
