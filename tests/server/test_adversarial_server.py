"""Adversarial clients against a live server (bugs found by a tester).

Oracles: the OpenAI API reference (nullable request fields accept `null`; `response_format`,
`tools` and `tool_choice` that cannot be honoured are refused, not silently ignored), the
per-status request counter in /metrics, which thread runs the tokenizer, the CLI exit code.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from hyla.cli import app
from tests.server.conftest import MODEL

USER = [{"role": "user", "content": "Hi"}]


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def _status_count(server, route: str, status: int) -> float:
    key = f'hyla_http_requests_total{{route="{route}",status="{status}"}} '
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(key):
            return float(line.split()[-1])
    return 0.0


def test_null_optional_fields_take_their_defaults(server):
    """Generated clients send `null` for unset fields (OpenAI marks them nullable)."""
    nulls = {"n": None, "stream": None, "stream_options": None, "seed": None, "stop": None,
             "temperature": None, "top_p": None, "presence_penalty": None, "user": None,
             "ignore_eos": None, "skip_special_tokens": None,
             "include_stop_str_in_output": None}
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2,
                                          "echo": None, "logprobs": None, "best_of": None,
                                          **nulls})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1 and r.json()["usage"]["completion_tokens"] >= 1
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 2,
                                               "logprobs": None, "top_logprobs": None,
                                               "add_generation_prompt": None, **nulls})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_null_required_field_still_names_it(server):
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": None})
    assert r.status_code == 422 and r.json()["error"]["param"] == "messages"


@pytest.mark.parametrize(
    "extra,param",
    [({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
      "response_format.json_schema.schema"),
     ({"tool_choice": "required"}, "tool_choice"),
     ({"tool_choice": {"type": "function", "function": {"name": "f"}}},
      "tool_choice.function.name"),
     ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
      "tools")],
    ids=["json_schema-without-schema", "tool-required-without-tools",
         "tool-named-not-in-tools", "tools-auto-template-shows-none"],
)
def test_constraints_that_cannot_be_honoured_are_refused(server, extra, param):
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": USER,
                                               "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_plain_response_format_and_no_tools_are_accepted(server):
    r = _post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": USER, "max_tokens": 2, "response_format": {"type": "text"},
        "tools": [], "tool_choice": "auto"})
    assert r.status_code == 200, r.text


def test_client_gone_during_upload_is_not_a_500(server):
    before_500 = _status_count(server, "/v1/completions", 500)
    host, port = server.url.rsplit("//", 1)[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{\"model\"")
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not _status_count(server, "/v1/completions", 499):
        time.sleep(0.05)
    assert _status_count(server, "/v1/completions", 499) >= 1
    assert _status_count(server, "/v1/completions", 500) == before_500


def test_text_prompts_are_not_tokenized_on_the_engine_thread(server, monkeypatch):
    """Tokenizing a multi-megabyte prompt takes seconds; on the engine thread it would stall
    every running stream. The echoed prompt is still the client's text."""
    tokenizer = server.engine.tokenizer
    threads: list[str] = []
    encode = tokenizer.encode

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return encode(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", spy)
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "Hello there",
                                          "max_tokens": 1, "echo": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith("Hello there")
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "word " * 2000,
                                          "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert threads and "hyla-engine" not in threads, threads
    assert server.thread.name not in threads, threads  # nor on the event loop


@pytest.mark.parametrize(
    "option,value", [("--port", "99999"), ("--port", "-1"), ("--drain-timeout", "-5"),
                     ("--max-request-bytes", "0")],
)
def test_serve_out_of_range_server_options_are_usage_errors(option, value):
    result = CliRunner().invoke(app, ["serve", option, value])
    assert result.exit_code == 2, result.output
    assert option in result.output and "Traceback" not in result.output


def test_engine_loop_survives_a_failing_abort(make_server, monkeypatch):
    """An exception on the engine thread outside `step()` (here: abort) used to kill the
    thread silently: every request in flight then hung until its client gave up."""
    server = make_server()
    engine = server.engine
    abort = engine.abort_request
    calls = []

    def flaky_abort(request_id):
        calls.append(request_id)
        if len(calls) == 1:
            raise RuntimeError("injected abort failure")
        return abort(request_id)

    monkeypatch.setattr(engine, "abort_request", flaky_abort)
    result: dict = {}

    def other_request() -> None:
        try:
            result["r"] = _post(server, "/v1/completions", {
                "model": MODEL, "prompt": "b", "max_tokens": 40, "ignore_eos": True})
        except httpx.HTTPError as e:
            result["r"] = e

    thread = threading.Thread(target=other_request)
    thread.start()
    body = {"model": MODEL, "prompt": "a", "max_tokens": 80, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 2:
                break  # disconnect: the server aborts the stream, and the abort raises
    thread.join(40)
    assert calls, "the abort was never attempted"
    assert isinstance(result.get("r"), httpx.Response), result
    assert result["r"].status_code == 200, result["r"].text
    assert server.async_engine.is_running
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "c", "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "args,needle",
    [(["generate", "hi", "--device", "foo"], "device:"),
     (["serve", "--port", "0", "--device", "nonsense:3"], "device:"),
     (["generate", "hi", "--tokenizer", "/nonexistent/tok"], "tokenizer:"),
     (["serve", "--port", "0", "--tokenizer", "/nonexistent/tok"], "tokenizer:")],
    ids=["generate-device", "serve-device", "generate-tokenizer", "serve-tokenizer"],
)
def test_cli_bad_device_or_tokenizer_is_a_clean_error(args, needle):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_cli_cuda_device_without_cuda_is_a_clean_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = CliRunner().invoke(app, ["generate", "hi", "--device", "cuda"])
    assert result.exit_code == 2 and "CUDA" in result.output, result.output


def _metric(server, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_random_disconnects_under_load_leave_nothing_allocated(make_server):
    """24 concurrent clients (streams and plain requests, n in {1, 2}, batches of prompts), half
    of them hanging up at random points; afterwards every block and slot is free in both the
    engine and /metrics, and the server still answers."""
    import asyncio
    import random

    server = make_server(engine_options={"max_num_seqs": 6, "max_num_batched_tokens": 32})
    rng = random.Random(1234)

    async def one(client: httpx.AsyncClient) -> str:
        stream, cut = rng.random() < 0.6, rng.random() < 0.5
        chat = stream and rng.random() < 0.4
        body = {"model": MODEL, "max_tokens": rng.randint(1, 24), "n": rng.choice([1, 2]),
                "temperature": rng.choice([0, 1.0]), "ignore_eos": True}
        if chat:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": "hi"}]
        else:
            path = "/v1/completions"
            body["prompt"] = rng.choice(["x " * rng.randint(1, 30), ["a b", "c"],
                                         [[5, 6, 7], [8]]])
        if stream:
            body["stream"] = True
            async with client.stream("POST", path, json=body) as r:
                limit = rng.randint(0, 5) if cut else None
                async for i, _ in _aenumerate(r.aiter_lines()):
                    if limit is not None and i >= limit:
                        return "cut"
                return str(r.status_code)
        try:
            r = await asyncio.wait_for(client.post(path, json=body),
                                       timeout=rng.uniform(0.01, 0.3) if cut else 60)
            return str(r.status_code)
        except TimeoutError:
            return "cut"

    async def run() -> list[str]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(*(one(client) for _ in range(24)))

    results = asyncio.run(run())
    assert set(results) <= {"200", "cut"}, results
    stats = server.wait_idle(15)
    assert stats.num_free_blocks == stats.num_total_blocks, stats
    assert stats.num_free_slots == stats.num_total_slots, stats
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _metric(server, "hyla_num_requests_in_flight"):
        time.sleep(0.05)
    assert _metric(server, "hyla_cache_blocks_free") == _metric(server, "hyla_cache_blocks_total")
    assert _metric(server, "hyla_state_slots_free") == _metric(server, "hyla_state_slots_total")
    assert _metric(server, "hyla_num_requests_running") == 0
    assert _status_count(server, "/v1/completions", 500) == 0
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "still here", "max_tokens": 2})
    assert r.status_code == 200, r.text


async def _aenumerate(aiter):
    i = 0
    async for item in aiter:
        yield i, item
        i += 1


@pytest.mark.parametrize(
    "extra,param",
    [({"stop": [f"<{i}>" for i in range(65)]}, "stop"),
     ({"stop_token_ids": list(range(1025))}, "stop_token_ids")],
    ids=["stop-strings", "stop-token-ids"],
)
def test_unbounded_stop_lists_are_refused(server, extra, param):
    """Each generated token is checked against every stop entry on the engine thread."""
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                          **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and ("64" in err["message"] or "1024" in err["message"])
    ok = {"stop": [f"<{i}>" for i in range(64)], "stop_token_ids": list(range(1024))}
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                          param: ok[param]})
    assert r.status_code == 200, r.text


def test_slow_consumer_of_a_prompt_batch_buffers_one_output_per_prompt():
    """`iterate` merges the streams of a batch of prompts; it used to copy every cumulative
    output into an unbounded queue, so a slow client of a long batch held O(steps) copies. Now
    an unread delta takes the later ones in: every token arrives once, in order."""
    import asyncio

    from hyla.request import CompletionOutput, RequestMetrics, RequestOutput
    from hyla.server.metrics import ServerMetrics
    from hyla.server.serving import Batch, iterate

    steps = 50

    def output(rid: str, k: int) -> RequestOutput:
        done = k == steps
        comp = CompletionOutput(index=0, text=f"<{k}>", token_ids=[k], logprobs=None,
                                cumulative_logprob=None, finish_reason="length" if done else None)
        return RequestOutput(request_id=rid, prompt="p", prompt_token_ids=[1], outputs=[comp],
                             prompt_logprobs=None, finished=done,
                             metrics=RequestMetrics(arrival_time=0.0))

    class FastStream:
        """Yields all its delta outputs at once, as an engine far ahead of the client."""

        def __init__(self, rid: str) -> None:
            self.rid = rid

        async def __aiter__(self):
            for k in range(1, steps + 1):
                yield output(self.rid, k)

        def abort(self) -> None:
            pass

    async def consume() -> list[tuple[int, RequestOutput]]:
        metrics = ServerMetrics(engine=None)
        streams = [FastStream("a"), FastStream("b")]
        batch = Batch(streams, [metrics.tracker() for _ in streams], 1, "cmpl-x")
        seen = []
        async for item in iterate(batch):
            seen.append(item)
            await asyncio.sleep(0.01)  # a slow client
        return seen

    seen = asyncio.run(consume())
    finals = {i: out for i, out in seen if out.finished}
    assert sorted(finals) == [0, 1]
    for i in (0, 1):
        ids = [t for j, out in seen if j == i for t in out.outputs[0].token_ids]
        text = "".join(out.outputs[0].text for j, out in seen if j == i)
        assert ids == list(range(1, steps + 1))
        assert text == "".join(f"<{k}>" for k in range(1, steps + 1))
    assert len(seen) <= 8, len(seen)  # one or two per prompt, not 2 * 50
