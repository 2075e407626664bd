"""Inputs and faults that used to get a misleading answer (issue 40): each now gets a 4xx
naming its field, or leaves the other requests unharmed.

Oracles: the OpenAI error JSON's `param` and status; a solo run of the same request.
"""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import MODEL

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
