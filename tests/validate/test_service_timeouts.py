"""The greedy-comparison sub-checks (`stream`, `concurrent`) when the server's request timeout
cuts runs short, as `hyla serve --request-timeout 4` did on a loaded CI machine: a run ended
with finish_reason "timeout" and a prefix of the text. In CI that failed `concurrent` with all
four requests "differing" from solo although every token agreed (measured: 8 busy processes on
2 cores cut 1-5 of the 5 runs in 6 of 8 rounds; not one token differed).

The fakes: `cut` cuts each run after 1-3 of its 6 words (a prefix); `queue_timeout` ends its
first stream with hyla's error event for a request timed out before its first token (retried,
as `complete` retries the 503); `diverge_cut` and `diverge_length` answer every second request
with other words (finish "timeout" or "length"), i.e. output that depends on what else ran:
those must still fail.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from hyla.validate.result import FAIL, PASS
from hyla.validate.service import _concurrent, _stream
from hyla.validate.service_client import Client, free_port

WORDS = [" alpha", " beta", " gamma", " delta", " epsilon", " zeta"]
WRONG = [" alpha", " beta", " omega"]
QUEUE_TIMEOUT_EVENT = (
    'data: {"error": {"message": "timed out", "type": "server_error", "code": "queue_timeout"}}'
    "\n\ndata: [DONE]\n\n"
)


def _answer(mode: str, count: int) -> tuple[list[str], str]:
    """(pieces, finish_reason) of the `count`-th completion of a fake in `mode`."""
    if mode == "cut":
        return WORDS[: 1 + count % 3], "timeout"
    if count % 2 == 1:
        return WRONG, "timeout" if mode == "diverge_cut" else "length"
    return WORDS, "length"


def fake_app(mode: str) -> FastAPI:
    app = FastAPI()
    lock, state = threading.Lock(), {"count": 0}

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "fake"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        with lock:
            pieces, reason = _answer(mode, state["count"])
            state["count"] += 1
        if not body.get("stream"):
            return {"choices": [{"text": "".join(pieces), "finish_reason": reason}]}
        if mode == "queue_timeout" and not state.setdefault("streamed", False):
            state["streamed"] = True
            return StreamingResponse(iter([QUEUE_TIMEOUT_EVENT]), media_type="text/event-stream")

        async def events():
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                chunk = {"choices": [{"text": piece, "finish_reason": reason if last else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture
def serve():
    servers = []

    def start(mode: str) -> Client:
        port = free_port()
        srv = uvicorn.Server(uvicorn.Config(fake_app(mode), port=port, log_level="error"))
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        servers.append((srv, thread))
        while not srv.started:
            time.sleep(0.05)
        return Client(f"http://127.0.0.1:{port}/v1")

    yield start
    for srv, thread in servers:
        srv.should_exit = True
        thread.join(timeout=10)


def test_runs_cut_by_the_request_timeout_compare_as_prefixes(serve):
    client = serve("cut")
    for check in (_concurrent, _stream):
        status, detail = check(client)
        assert status == PASS, detail
        assert "cut by the request timeout" in detail, detail


def test_a_stream_timed_out_before_its_first_token_is_retried(serve):
    status, detail = _stream(serve("queue_timeout"))
    assert (status, detail) == (PASS, "equal")


@pytest.mark.parametrize("mode", ["diverge_cut", "diverge_length"])
def test_runs_that_differ_still_fail(serve, mode):
    client = serve(mode)
    for check in (_concurrent, _stream):
        status, detail = check(client)
        assert status == FAIL, detail
        assert "omega" in detail, detail
