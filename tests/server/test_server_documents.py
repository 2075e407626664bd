"""POST/GET/DELETE /v1/cache/documents on a live server: a pinned document is listed, counted
on /metrics and reused by a completion; bad bodies get 400/422 naming the field."""

from __future__ import annotations

import httpx

URL = "/v1/cache/documents"


def test_pin_list_reuse_unpin(make_server):
    server = make_server(engine_options=dict(max_model_len=256, state_checkpoint_stride=32))
    doc = list(range(10, 110))
    r = httpx.post(server.url + URL, json={"name": "manual", "token_ids": doc}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["num_pinned_tokens"] == 96
    listed = httpx.get(server.url + URL).json()["data"]
    assert [d["name"] for d in listed] == ["manual"]
    metrics = httpx.get(server.url + "/metrics").text
    assert "hyla_documents_pinned 1.0" in metrics
    out = server.client().completions.create(model="tiny", prompt=doc + [7, 8, 9], max_tokens=2)
    assert out.usage.prompt_tokens == 103
    assert server.engine.cache.prefix.stats.num_hit_tokens >= 96
    r = httpx.delete(server.url + URL + "/manual")
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert httpx.delete(server.url + URL + "/manual").status_code == 404
    assert httpx.get(server.url + URL).json()["data"] == []
    stats = server.wait_idle()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_bad_document_bodies(make_server):
    server = make_server()
    cases = [
        ({"token_ids": [1, 2]}, 422, "name"),
        ({"name": "", "text": "hello"}, 422, "name"),
        ({"name": "x"}, 400, "text"),
        ({"name": "x", "text": "a", "token_ids": [1]}, 400, "text"),
        ({"name": "x", "token_ids": [10**9]}, 400, "token_ids"),
        ({"name": "x", "token_ids": [1, 2]}, 400, "token_ids"),  # shorter than a block
        ({"name": "x", "token_ids": "abc"}, 422, "token_ids"),
    ]
    for body, status, param in cases:
        r = httpx.post(server.url + URL, json=body, timeout=60)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)
    server.wait_idle()


def test_store_down_is_never_a_5xx(make_server):
    from tests.redis_server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    server = make_server(engine_options=dict(kv_offload_remote_url=url,
                                             kv_offload_remote_timeout=0.05))  # fmt: skip
    doc = list(range(10, 60))
    r = httpx.post(server.url + URL, json={"name": "d", "token_ids": doc}, timeout=60)
    assert r.status_code == 200, r.text
    out = server.client().completions.create(model="tiny", prompt=doc + [5], max_tokens=2)
    assert out.choices[0].finish_reason == "length"
    assert server.engine.cache.tiers.tiers[0].stats.num_errors >= 1
    assert httpx.delete(server.url + URL + "/d").status_code == 200
    stats = server.wait_idle()
    assert stats.num_free_blocks == stats.num_total_blocks
