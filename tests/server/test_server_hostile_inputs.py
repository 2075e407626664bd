"""Inputs and faults that used to get a misleading answer (issue 40): each now gets a 4xx
naming its field, or leaves the other requests unharmed.

Oracles: the OpenAI error JSON's `param` and status; a solo run of the same request.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from hyla.server import limits
from tests.server.conftest import MODEL
from tests.server.test_server_cli import ROOT, _free_port, checkpoint  # noqa: F401, F811

USER = [{"role": "user", "content": "Hi"}]


def _raw_post(server, path: str, content: bytes) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=content, timeout=30,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("where", ["key", "value"])
def test_lone_surrogate_in_chat_template_kwargs_is_400_naming_it(server, where):
    kwargs = b'{"\\ud800": 1}' if where == "key" else b'{"enable_thinking": "a\\udc00"}'
    body = (b'{"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": '
            b'"Hi"}], "chat_template_kwargs": ' + kwargs + b"}")
    r = _raw_post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("chat_template_kwargs")
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize("path,field", [("/v1/completions", "prompt"),
                                        ("/v1/chat/completions", "messages")])
def test_deeply_nested_json_is_refused_naming_the_limit(server, path, field):
    depth = 5000
    body = b'{"model": "tiny", "%s": ' % field.encode() + b"[" * depth + b"]" * depth + b"}"
    r = _raw_post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "nested deeper" in err["message"], err
    assert "levels" in err["message"]  # the limit


def _vision_engine(max_image_bytes: int) -> Any:
    from hyla.config import EngineConfig

    config = EngineConfig.from_kwargs(max_image_bytes=max_image_bytes)
    return SimpleNamespace(engine=SimpleNamespace(multimodal=object(), config=config))


@pytest.mark.parametrize("max_image_bytes", [20 << 20, 9 << 20, 1 << 10])
def test_the_default_body_limit_admits_an_image_at_max_image_bytes(max_image_bytes):
    """The body of a chat carrying one image of exactly `max_image_bytes` as a data URL (the
    OpenAI client's form) fits the default body limit of a vision model."""
    url = "data:image/png;base64," + base64.b64encode(bytes(max_image_bytes)).decode()
    body = json.dumps({"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this image? " * 100},
        {"type": "image_url", "image_url": {"url": url}}]}]}).encode()  # fmt: skip
    assert len(body) <= limits.request_bytes_limit(None, _vision_engine(max_image_bytes))
    text_engine = SimpleNamespace(engine=SimpleNamespace(multimodal=None))
    assert limits.request_bytes_limit(None, text_engine) == 8 << 20


def test_an_explicit_body_limit_is_kept_and_an_unreachable_image_limit_is_said(caplog):
    with caplog.at_level("WARNING", logger="hyla.server"):
        assert limits.request_bytes_limit(1 << 20, _vision_engine(20 << 20)) == 1 << 20
    assert "max_image_bytes" in caplog.text


@pytest.mark.parametrize("stderr", ["full", "closed"])
def test_serve_runs_with_an_unwritable_stderr(checkpoint, stderr):  # noqa: F811
    """`2>/dev/full` (every write fails) or `2>&-`: the weight-loading progress bar made the
    server exit 1 before it loaded, saying nothing; now it serves and drains as usual."""
    port = _free_port()
    cmd = [sys.executable, "-m", "hyla.cli", "serve", str(checkpoint), "--port", str(port),
           "--served-model-name", "tiny", "--kv-cache-memory", str(16 << 20)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=full if stderr == "full" else None,
            preexec_fn=(lambda: os.close(2)) if stderr == "closed" else None,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port):
            assert proc.poll() is None, f"exited with {proc.returncode}"
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("n,logprobs,param", [(16, 20, "n"), (1, 20, "logprobs")])
def test_echo_logprobs_over_the_per_request_limit_is_400_naming_the_field(
    make_server, n, logprobs, param
):
    from hyla.engine.validate import MAX_PROMPT_LOGPROBS

    server = make_server(engine_options={"max_model_len": 16384, "kv_cache_memory": 8 << 20})
    prompt_len = MAX_PROMPT_LOGPROBS // (n * (logprobs + 1)) + 1  # one token over
    body = {"model": MODEL, "prompt": [5] * prompt_len, "max_tokens": 1, "n": n,
            "logprobs": logprobs, "echo": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and str(MAX_PROMPT_LOGPROBS) in err["message"], err
    # at the limit it passes (the engine's own check, without a server run of that size)
    from hyla.engine.validate import check_prompt_logprobs_cost
    from hyla.request import SamplingParams

    at_limit = SamplingParams(n=n, logprobs=logprobs, prompt_logprobs=logprobs)
    check_prompt_logprobs_cost(MAX_PROMPT_LOGPROBS // (n * (logprobs + 1)), at_limit)
