"""The service-contract checks against servers with injected faults: an OpenAI-compatible fake
whose streamed text differs from its non-streamed text, which accepts bad inputs with 200, and
whose /metrics keeps a cancelled request running (a leak). Each fault must fail its sub-check;
the healthy fake passes the checks that do not need hyla's engine."""

from __future__ import annotations

import json
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from hyla.validate.result import FAIL, PASS, SKIP
from hyla.validate.service import _subchecks
from hyla.validate.service_client import Client, free_port


def fake_app(faulty: bool) -> FastAPI:
    app = FastAPI()
    state = {"running": 0}

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "fake"}]}

    @app.get("/metrics")
    def metrics():
        lines = [f"hyla_num_requests_running {state['running']}.0",
                 "hyla_cache_blocks_free 100.0", "hyla_state_slots_free 8.0",
                 "hyla_prefix_cache_hit_tokens_total 0.0"]  # fmt: skip
        return PlainTextResponse("\n".join(lines) + "\n")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        ok = isinstance(body.get("prompt"), str) and len(body["prompt"]) < 100000
        ok = ok and body.get("max_tokens", 1) >= 1 and body.get("temperature", 0) >= 0
        ok = ok and body.get("n", 1) >= 1 and body.get("top_p", 1) <= 1
        if not ok and not faulty:
            return JSONResponse({"error": {"message": "bad"}}, 400)
        text = "".join(f" w{len(body.get('prompt', '')) % (i + 7)}" for i in range(4))
        if not body.get("stream"):
            return {"choices": [{"text": text, "finish_reason": "length"}]}

        async def events():
            state["running"] += 1
            pieces = text.split(" ")[1:] + (["!"] if faulty else [])
            for i, piece in enumerate(pieces):
                chunk = {"choices": [{"text": " " + piece if piece != "!" else piece,
                                      "finish_reason": "length" if i == len(pieces) - 1
                                      else None}]}  # fmt: skip
                yield f"data: {json.dumps(chunk)}\n\n"
            if not faulty:
                state["running"] -= 1
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(params=[False, True], ids=["healthy", "faulty"])
def server(request):
    port = free_port()
    config = uvicorn.Config(fake_app(request.param), port=port, log_level="error")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    yield request.param, f"http://127.0.0.1:{port}/v1"
    srv.should_exit = True
    thread.join(timeout=10)


def test_service_subchecks_catch_injected_faults(server):
    faulty, url = server
    client = Client(url)
    status = {name: run()[0] for name, run in _subchecks(client, None).items()}
    assert status["concurrent"] == PASS
    assert status["timeout"] == SKIP and status["retry_503"] == SKIP  # needs the server's config
    if faulty:
        assert status["stream"] == status["bad_inputs"] == status["cancel"] == FAIL
    else:
        assert status["stream"] == status["bad_inputs"] == status["cancel"] == PASS
    assert status["prefix"] == FAIL  # equal text, but no prefix-cache hit in /metrics
