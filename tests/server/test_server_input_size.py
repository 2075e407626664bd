"""Inputs whose size alone rules them out are refused before the schema validates them and
before they are rendered, tokenised or checked id by id (issue 18 item 4): a token-id prompt
that fills the context window and a conversation with at least max_model_len messages get a
400 naming the field and the limit (`hyla/server/limits.py`)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np

from hyla.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.server.conftest import MODEL


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_token_id_prompt_over_the_window_is_refused_by_size(server):
    n = server.engine.max_model_len
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": [5] * n, "max_tokens": 1})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "prompt" and f"{n} token ids" in err["message"]
    batch = {"model": MODEL, "prompt": [[5, 6], [7] * (n + 3)], "max_tokens": 1}
    r = _post(server, "/v1/completions", batch)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt[1]"


def test_too_many_messages_are_refused_before_rendering(server):
    n = server.engine.max_model_len
    messages = [{"role": "user", "content": "hi"}] * n
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"


def test_sizes_are_checked_before_the_schema(server):
    """The size gate runs before pydantic validates the body: a request too large by its count
    and malformed elsewhere gets the size's 400, not the schema's 422."""
    n = server.engine.max_model_len
    bad = {"model": MODEL, "temperature": "hot", "max_tokens": 1}
    r = _post(server, "/v1/completions", {**bad, "prompt": [5] * n})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert f"at most {n - 1} prompt tokens" in r.json()["error"]["message"]
    messages = [{"role": "user", "content": "hi"}] * n
    r = _post(server, "/v1/chat/completions", {**bad, "messages": messages})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert f"at most {n - 1} messages" in r.json()["error"]["message"]
    r = _post(server, "/v1/completions", {**bad, "prompt": ["a"] * 65})
    assert r.status_code == 400 and "at most 64 prompts" in r.json()["error"]["message"]
    r = _post(server, "/v1/completions", {**bad, "prompt": [5, 6]})
    assert r.status_code == 422  # within the limits: the schema speaks


def _stream_times(server, times: list[float], max_tokens: int) -> None:
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())


def test_huge_requests_do_not_stall_a_running_stream(server):
    """A 3.2 MB chat request with 100k messages and one with 1M token ids, sent while another
    stream runs, are refused without stalling it: the stream's largest inter-token gap during
    them stays well under what pydantic alone takes to validate the same bodies (which it did
    on the event loop, holding the GIL, before the size gate). The measured figures live in
    bench/host_limits_cpu.py."""
    messages = [{"role": "user", "content": "hello"}] * 100_000
    chat = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 1}).encode()
    ids = json.dumps({"model": MODEL, "prompt": [5] * 1_000_000, "max_tokens": 1}).encode()
    start = time.perf_counter()
    ChatCompletionRequest.model_validate_json(chat)
    CompletionRequest.model_validate_json(ids)
    validation_s = time.perf_counter() - start
    times: list[float] = []
    max_tokens = server.engine.max_model_len - 16
    thread = threading.Thread(target=_stream_times, args=(server, times, max_tokens))
    thread.start()
    while len(times) < 5 and thread.is_alive():
        time.sleep(0.005)
    window = time.perf_counter()
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", ids)):
        r = httpx.post(
            f"{server.url}{path}",
            content=body,
            timeout=60,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400, r.text
    end = time.perf_counter()
    thread.join()
    assert times[-1] > end, "the stream ended before the huge requests did"
    t = np.asarray(times)
    gaps = np.diff(t)[(t[1:] >= window) & (t[:-1] <= end)]
    assert gaps.max() < 0.5 * validation_s, (gaps.max(), validation_s)
