"""Inputs whose size alone rules them out are refused before they are rendered, tokenised or
checked id by id (issue 18 item 4): a token-id prompt that fills the context window and a
conversation with at least max_model_len messages get a 400 naming the field; a request
waiting behind them is not held up (the oracle: how long the same small request takes alone).
"""

from __future__ import annotations

import threading
import time

import httpx

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


def test_a_huge_request_does_not_stall_a_small_one(server):
    small = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    t0 = time.monotonic()
    assert _post(server, "/v1/completions", small).status_code == 200
    alone = time.monotonic() - t0
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 100_000}
    results = {}
    thread = threading.Thread(
        target=lambda: results.update(huge=_post(server, "/v1/chat/completions", huge))
    )
    thread.start()
    t0 = time.monotonic()
    assert _post(server, "/v1/completions", small).status_code == 200
    beside = time.monotonic() - t0
    thread.join()
    assert results["huge"].status_code == 400
    assert beside < alone + 5.0, (alone, beside)  # parsing 100k messages: not rendering them
