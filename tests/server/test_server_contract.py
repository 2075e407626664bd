"""The service contract on a live server: no request field silently ignored, what the API key
protects, the statuses the OpenAPI schema lists, queue timeouts as errors, bounded body reads.

Oracles: the OpenAI API reference (its request fields; 400 for an unsupported argument), the
same request without the no-op fields (equal greedy output), the statuses the routes answer,
raw HTTP bytes on a socket.
"""

from __future__ import annotations

import inspect
import socket
import threading
import time

import httpx
import openai
import pytest
from typer.testing import CliRunner

from hyla.cli import app
from hyla.scheduler import SchedulerOutput
from tests.server.conftest import MODEL

USER = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# (endpoint, fields, the param the 400 names): OpenAI request fields hyla does not implement
# (tools with tool_choice auto: the test model's chat template does not show tools).
UNSUPPORTED = [
    ("chat", {"tools": [TOOL], "tool_choice": "auto"}, "tools"),
    ("chat", {"tools": [TOOL]}, "tools"),
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"function_call": {"name": "f"}}, "function_call"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("chat", {"web_search_options": {}}, "web_search_options"),
    ("chat", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("chat", {"verbosity": "low"}, "verbosity"),
    ("chat", {"metadata": {"k": "v"}}, "metadata"),
    ("chat", {"store": True}, "store"),
    ("chat", {"service_tier": "flex"}, "service_tier"),
    ("chat", {"logit_bias": {"5": 10}}, "logit_bias"),
    ("chat", {"no_such_field": 1}, "no_such_field"),
    (
        "chat",
        {"stream": True, "stream_options": {"continuous_usage_stats": True}},
        "stream_options.continuous_usage_stats",
    ),
    (
        "chat",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ]
        },
        "messages[0].content[0].cache_control",
    ),
    ("chat", {"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
    # the default model's chat template reads no such variable: it was dropped
    (
        "chat",
        {"chat_template_kwargs": {"enable_thinking": False}},
        "chat_template_kwargs.enable_thinking",
    ),
    # max_tokens is 4 in every request here: a different max_completion_tokens hid it
    ("chat", {"max_completion_tokens": 5}, "max_completion_tokens"),
    # the default model's chat template has no place for a name: it was dropped
    ("chat", {"messages": [{"role": "user", "content": "Hi", "name": "bob"}]}, "messages[0].name"),
    ("completions", {"suffix": "x"}, "suffix"),
    ("completions", {"logit_bias": {"5": 10}}, "logit_bias"),
    ("completions", {"store": True}, "store"),
    ("completions", {"tools": [TOOL]}, "tools"),
    ("completions", {"no_such_field": 1}, "no_such_field"),
]


def _create(client: openai.OpenAI, endpoint: str, fields: dict, **kw) -> object:
    """One request through the official client; unknown names go in extra_body, as a client
    of a newer API would send them."""
    base = {"model": MODEL, "max_tokens": 4, **kw}
    if endpoint == "chat":
        base["messages"] = fields.pop("messages", USER)
        create = client.chat.completions.create
    else:
        base["prompt"] = "Hi"
        create = client.completions.create
    known = set(inspect.signature(create).parameters)
    typed = {k: v for k, v in fields.items() if k in known}
    extra = {k: v for k, v in fields.items() if k not in known}
    return create(**base, **typed, extra_body=extra or None)


@pytest.mark.parametrize(
    "endpoint,fields,param", UNSUPPORTED, ids=[f"{e}-{p}" for e, _, p in UNSUPPORTED]
)
def test_unimplemented_fields_are_400_naming_them(server, endpoint, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        _create(server.client(), endpoint, dict(fields))
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body
    assert param in e.value.message
    assert e.value.body["code"] in ("unsupported_parameter", "unsupported_value", "invalid_value")


NO_OPS = {
    "chat": {
        "user": "u1",
        "safety_identifier": "s",
        "prompt_cache_key": "k",
        "store": False,
        "service_tier": "auto",
        "parallel_tool_calls": False,
        "tools": [],
        "tool_choice": "none",
        "function_call": "none",
        "modalities": ["text"],
        "response_format": {"type": "text"},
        "max_completion_tokens": 6,  # equal to max_tokens
        "audio": None,  # null: an unimplemented field left unset
        "metadata": None,
    },
    "completions": {
        "user": "u1",
        "safety_identifier": "s",
        "store": False,
        "service_tier": "default",
    },
}


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_noop_fields_are_accepted_and_change_nothing(server, endpoint):
    client = server.client()
    plain = _create(client, endpoint, {}, temperature=0, max_tokens=6)
    with_noops = _create(client, endpoint, dict(NO_OPS[endpoint]), temperature=0, max_tokens=6)
    text = (
        (lambda r: r.choices[0].message.content)
        if endpoint == "chat"
        else (lambda r: r.choices[0].text)
    )
    assert text(with_noops) == text(plain)


def test_chat_template_arguments_that_change_nothing_are_400(server):
    """Oracle: the rendered prompt. Without a chat template (the plain fallback) every
    chat_template_kwargs was dropped; `name` counts when the template renders it."""
    import copy

    from hyla.server.convert import chat_prompt_ids
    from hyla.server.errors import APIError
    from hyla.server.protocol import ChatCompletionRequest

    def ids(tokenizer, **fields):
        return chat_prompt_ids(tokenizer, ChatCompletionRequest(messages=USER, **fields))

    plain = copy.copy(server.engine.tokenizer)
    plain.chat_template = None
    with pytest.raises(APIError) as e:
        ids(plain, chat_template_kwargs={"enable_thinking": False})
    assert e.value.status == 400 and e.value.param == "chat_template_kwargs"
    assert ids(plain, chat_template_kwargs={}) == ids(plain)
    named = copy.copy(server.engine.tokenizer)
    named.chat_template = (
        "{% for m in messages %}{{ m.name or m.role }}: "
        "{{ m.content }}\n{% endfor %}"
    )
    bob = [{"role": "user", "content": "Hi", "name": "bob"}]
    with_name = chat_prompt_ids(named, ChatCompletionRequest(messages=bob))
    assert with_name != ids(named)
    assert named.decode(with_name).startswith("bob: Hi")
    named.chat_template += "{% if greeting %}{{ greeting }}{% endif %}"
    assert named.decode(ids(named, chat_template_kwargs={"greeting": "Hello"})).endswith("Hello")


def test_stream_include_obfuscation_is_accepted(server):
    stream = server.client().chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


# -- auth ------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["option", "env", "blank", "env-padded"])
def test_empty_api_key_is_an_error_at_start(how, monkeypatch):
    from hyla import cli

    monkeypatch.setattr(cli, "_load_engine", lambda *a: pytest.fail("started without auth"))
    args, env = ["serve", "--port", "0"], {}
    if how == "option":
        args += ["--api-key", ""]
    elif how == "env":
        env["HYLA_API_KEY"] = ""
    elif how == "env-padded":
        env["HYLA_API_KEY"] = " s3cret"
    else:
        args += ["--api-key", "  "]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert ("HYLA_API_KEY" if how.startswith("env") else "--api-key") in result.output


def test_empty_api_key_in_build_app_is_an_error(server):
    from hyla.server.api import build_app

    with pytest.raises(ValueError, match="api_key"):
        build_app(server.async_engine, MODEL, api_key="")


def test_api_key_protects_every_route_but_health(make_server):
    server = make_server(api_key="s3cret")
    paths = ["/v1/models", "/metrics", "/docs", "/openapi.json"]
    for path in paths:
        r = httpx.get(f"{server.url}{path}", timeout=10)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "invalid_api_key"
        ok = httpx.get(
            f"{server.url}{path}", headers={"Authorization": "Bearer s3cret"}, timeout=10
        )
        assert ok.status_code == 200, path
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    assert (
        server.client("s3cret").completions.create(model=MODEL, prompt="Hi", max_tokens=1).choices
    )


# -- schema and statuses ---------------------------------------------------------------------


def test_openapi_lists_the_error_statuses_and_metrics_as_text(server):
    spec = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = spec["paths"][path]["post"]["responses"]
        for status in ("400", "401", "404", "408", "413", "422", "500", "503"):
            assert status in responses, (path, status)
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema["$ref"].endswith("/ErrorResponse"), (path, status)
        assert "text/event-stream" in responses["200"]["content"]
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    assert "503" in spec["paths"]["/health"]["get"]["responses"]
    r = httpx.get(f"{server.url}/metrics", timeout=10)
    assert r.headers["content-type"].startswith("text/plain")


def test_queue_timeout_before_the_first_token_is_an_error(make_server, monkeypatch):
    """A request that got no token before `request_timeout` (here: an engine that makes no
    progress, as under a long queue) is a 503 `queue_timeout`, not a 200 with empty text."""
    server = make_server(engine_options={"request_timeout": 0.5})
    scheduler = server.engine.scheduler
    real_schedule = scheduler.schedule
    monkeypatch.setattr(
        scheduler, "schedule", lambda *_, **__: (time.sleep(0.02), SchedulerOutput())[1]
    )
    client = server.client()
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    assert e.value.status_code == 503 and e.value.body["code"] == "queue_timeout"
    assert int(e.value.response.headers["retry-after"]) >= 1
    stream = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, stream=True)
    with pytest.raises(openai.APIError, match="timed out"):
        list(stream)
    monkeypatch.setattr(scheduler, "schedule", real_schedule)
    server.wait_idle()
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices


def test_body_shorter_than_content_length_is_dropped_in_bounded_time(make_server):
    server = make_server(body_timeout=1.0)
    host, port = server.url.rsplit("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b'application/json\r\nContent-Length: 100\r\n\r\n{"model"'
        )
        received = b""
        while chunk := sock.recv(4096):  # the server closes the connection after its answer
            received += chunk
        elapsed = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert b"Content-Length 100" in received
    assert 0.9 < elapsed < 5
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_slow_but_complete_body_is_served(make_server):
    server = make_server(body_timeout=5.0)
    host, port = server.url.rsplit("//", 1)[1].split(":")
    body = b'{"model": "tiny", "prompt": "Hi", "max_tokens": 1}'
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body[:10])
        time.sleep(0.3)
        sock.sendall(body[10:])
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:200]


def test_concurrent_streams_are_unaffected_by_a_stalled_upload(make_server):
    server = make_server(body_timeout=1.0)
    host, port = server.url.rsplit("//", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
    results = []
    thread = threading.Thread(
        target=lambda: results.append(
            server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=3)
        )
    )
    thread.start()
    thread.join(30)
    sock.close()
    assert results and results[0].usage.completion_tokens == 3
