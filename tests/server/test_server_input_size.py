"""Inputs whose size alone rules them out are refused before they are rendered, tokenised or
checked id by id (issue 18 item 4): a token-id prompt that fills the context window and a
conversation with at least max_model_len messages get a 400 naming the field."""

from __future__ import annotations

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
