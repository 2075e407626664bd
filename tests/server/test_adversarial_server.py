"""Adversarial clients against a live server (bugs found by a tester).

Oracles: the OpenAI API reference (nullable request fields accept `null`; `response_format` and
`tool_choice` that cannot be honoured are refused, not silently ignored), the per-status request
counter in /metrics, which thread runs the tokenizer, the CLI exit code.
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
    [({"response_format": {"type": "json_object"}}, "response_format"),
     ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
      "response_format"),
     ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
      "tool_choice"),
     ({"tools": [{"type": "function", "function": {"name": "f"}}],
       "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice")],
    ids=["json_object", "json_schema", "tool-required", "tool-named"],
)
def test_constraints_that_cannot_be_honoured_are_refused(server, extra, param):
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": USER,
                                               "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_plain_response_format_and_auto_tools_are_accepted(server):
    r = _post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": USER, "max_tokens": 2, "response_format": {"type": "text"},
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"})
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


def test_serve_port_out_of_range_is_a_usage_error():
    result = CliRunner().invoke(app, ["serve", "--port", "99999"])
    assert result.exit_code == 2, result.output
    assert "port" in result.output.lower() and "Traceback" not in result.output


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
