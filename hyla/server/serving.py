"""Completions and chat completions: admit requests, then answer as JSON or as an SSE stream.

Admission (`start_streams`) happens before any byte of the response is sent, so every bad input
becomes a proper HTTP status. After that, a streaming response can only end with an SSE
`error` event. Every path that stops listening to a stream aborts it (`finally`), so a client
disconnect frees the request's blocks and state slot before the engine's next step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from hyla.engine.async_engine import AsyncEngine, RequestStream
from hyla.server.errors import to_api_error
from hyla.server.metrics import RequestTracker, ServerMetrics
from hyla.server.protocol import ErrorInfo, ErrorResponse, UsageInfo


@dataclass
class Context:
    """What the routes share: the engine, the served name and the metrics."""

    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics


@dataclass
class Batch:
    """The engine requests of one API request (one per prompt) and their latency trackers."""

    streams: list[RequestStream]
    trackers: list[RequestTracker]
    n: int
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def abort(self) -> None:
        for stream, tracker in zip(self.streams, self.trackers, strict=True):
            stream.abort()
            tracker.close()


async def start_streams(ctx: Context, prompts: list[Any], params: Any, request_id: str) -> Batch:
    """Admit one engine request per prompt (all or none). Raises the engine's errors."""
    streams: list[RequestStream] = []
    try:
        for i, prompt in enumerate(prompts):
            rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            streams.append(await ctx.engine.add_request(prompt, params, rid))
    except BaseException:
        for stream in streams:
            stream.abort()
        raise
    trackers = [ctx.metrics.tracker() for _ in streams]
    return Batch(streams, trackers, params.n, request_id)


async def iterate(batch: Batch) -> AsyncIterator[tuple[int, Any]]:
    """Yield `(prompt_index, RequestOutput)` from all streams as outputs arrive."""
    if len(batch.streams) == 1:
        async for output in batch.streams[0]:
            batch.trackers[0].observe(output)
            yield 0, output
        return
    # Outputs are cumulative: keep only the newest unread one per prompt, so a slow consumer
    # holds at most one output per prompt (not one full copy per engine step).
    latest: dict[int, Any] = {}
    errors: list[BaseException] = []
    ended: set[int] = set()
    ready = asyncio.Event()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                latest[i] = output
                ready.set()
        except Exception as e:
            errors.append(e)
        ended.add(i)
        ready.set()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(batch.streams)]
    try:
        while True:
            if errors:
                raise errors[0]
            if latest:
                i = next(iter(latest))
                output = latest.pop(i)
                batch.trackers[i].observe(output)
                yield i, output
                continue
            if len(ended) == len(tasks):
                return
            ready.clear()
            await ready.wait()
    finally:
        for task in tasks:
            task.cancel()


async def collect(request: Request, batch: Batch) -> list[Any] | None:
    """The final output of every prompt, or None if the client disconnected first."""
    finals: list[Any] = [None] * len(batch.streams)

    async def run() -> None:
        async for i, output in iterate(batch):
            finals[i] = output

    work = asyncio.create_task(run())
    watch = asyncio.create_task(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            work.result()
            return finals
        return None
    finally:
        for task in (work, watch):
            task.cancel()
        batch.abort()


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def usage_of(finals: list[Any]) -> UsageInfo:
    prompt = sum(len(o.prompt_token_ids) for o in finals if o is not None)
    completion = sum(len(c.token_ids) for o in finals if o is not None for c in o.outputs)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion)


def sse(payload: Any) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


async def sse_events(
    batch: Batch, make_events: Callable[[int, Any], list[str]], finish: Callable[[], list[str]],
    start: list[str] | None = None,
) -> AsyncIterator[str]:
    """The SSE body: `start` events, per-output events, `finish` events, then `[DONE]`.

    An engine failure mid-stream becomes an OpenAI error event; any exit aborts the batch.
    """
    try:
        for event in start or []:
            yield event
        async for i, output in iterate(batch):
            for event in make_events(i, output):
                yield event
        for event in finish():
            yield event
    except Exception as e:
        err = to_api_error(e)
        body = ErrorResponse(error=ErrorInfo(message=err.message, type="server_error",
                                             code=err.code))
        yield sse(body)
    finally:
        batch.abort()
    yield "data: [DONE]\n\n"


class DeltaTracker:
    """Per choice: how much text, how many tokens and whether the finish were already sent."""

    def __init__(self) -> None:
        self.num_chars: dict[int, int] = {}
        self.num_tokens: dict[int, int] = {}
        self.finished: set[int] = set()

    def delta(self, index: int, completion: Any) -> tuple[str, list[int], int, bool] | None:
        """(new text, new token ids, first new token position, newly finished) or None."""
        sent_chars = self.num_chars.get(index, 0)
        sent_tokens = self.num_tokens.get(index, 0)
        text = completion.text[sent_chars:] if len(completion.text) > sent_chars else ""
        new_ids = list(completion.token_ids[sent_tokens:])
        is_new_finish = completion.finish_reason is not None and index not in self.finished
        if not text and not new_ids and not is_new_finish:
            return None
        self.num_chars[index] = max(sent_chars, len(completion.text))
        self.num_tokens[index] = len(completion.token_ids)
        if is_new_finish:
            self.finished.add(index)
        return text, new_ids, sent_tokens, is_new_finish
