"""Completions and chat completions: admit requests, then answer as JSON or as an SSE stream.

Admission (`start_streams`) happens before any byte of the response is sent, so every bad input
becomes a proper HTTP status. After that, a streaming response can only end with an SSE
`error` event. Every path that stops listening to a stream aborts it (`finally`), so a client
disconnect frees the request's blocks and state slot before the engine's next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from hyla.engine.async_engine import AsyncEngine, RequestStream
from hyla.server.errors import APIError, to_api_error
from hyla.server.metrics import RequestTracker, ServerMetrics
from hyla.server.protocol import ErrorInfo, ErrorResponse, UsageInfo


@dataclass
class Context:
    """What the routes share: the engine, the served name, the metrics and the threads that
    render chats with http(s) images (`media_executor`, None: no remote images)."""

    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    media_executor: Any = None


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


def check_produced(output: Any, has_tokens: bool) -> None:
    """Raises APIError 503 for a request that ended by timeout or abort before its first token
    (`has_tokens`: an earlier output had one): an error says what happened; a 200 with empty
    text and finish_reason "timeout" did not."""
    if not output.finished or has_tokens or any(c.token_ids for c in output.outputs):
        return
    reasons = {c.finish_reason for c in output.outputs}
    if reasons == {"timeout"}:
        raise APIError(503, "the request timed out (request_timeout) in the queue before its "
                       "first token; retry later", code="queue_timeout",
                       headers={"Retry-After": "1"})
    if reasons == {"abort"}:
        raise APIError(503, "the server is shutting down: the request was ended before its "
                       "first token", code="shutting_down", headers={"Retry-After": "5"})


async def iterate(batch: Batch) -> AsyncIterator[tuple[int, Any]]:
    """Yield `(prompt_index, RequestOutput)` from all streams as outputs arrive (deltas, or
    final outputs only: each token and each finish once).

    Raises: APIError 503 when a request ended without a token (`check_produced`).
    """
    has_tokens: set[int] = set()

    def checked(i: int, output: Any) -> Any:
        batch.trackers[i].observe(output)
        check_produced(output, i in has_tokens)
        if any(c.token_ids for c in output.outputs):
            has_tokens.add(i)
        return output

    if len(batch.streams) == 1:
        async for output in batch.streams[0]:
            yield 0, checked(0, output)
        return
    # An unread output per prompt takes the later ones in (`RequestOutput.add`), so a slow
    # consumer holds at most one output per prompt, not one per engine step.
    latest: dict[int, Any] = {}
    errors: list[BaseException] = []
    ended: set[int] = set()
    ready = asyncio.Event()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                if i in latest:
                    latest[i].add(output)
                else:
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
                yield i, checked(i, latest.pop(i))
                continue
            if len(ended) == len(tasks):
                return
            ready.clear()
            await ready.wait()
    finally:
        for task in tasks:
            task.cancel()


async def collect(request: Request, batch: Batch) -> list[Any] | None:
    """The final output of every prompt, joined from its deltas, or None if the client
    disconnected first."""
    joined = [Joined() for _ in batch.streams]

    async def run() -> None:
        async for i, output in iterate(batch):
            joined[i].add(output)

    work = asyncio.create_task(run())
    watch = asyncio.create_task(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            work.result()
            return [j.output() for j in joined]
        return None
    finally:
        for task in (work, watch):
            task.cancel()
        batch.abort()


class Joined:
    """One prompt's DELTA outputs joined into its final output (pieces kept in lists, joined
    once at the end: O(length), not O(length) per step)."""

    def __init__(self) -> None:
        self.last: Any = None
        self.prompt_logprobs: Any = None
        self.pieces: dict[int, tuple[list[str], list[int], list[Any] | None]] = {}
        self.ends: dict[int, Any] = {}

    def add(self, output: Any) -> None:
        self.last = output
        self.prompt_logprobs = self.prompt_logprobs or output.prompt_logprobs
        for c in output.outputs:
            texts, ids, lps = self.pieces.setdefault(
                c.index, ([], [], None if c.logprobs is None else []))
            texts.append(c.text)
            ids.extend(c.token_ids)
            if lps is not None and c.logprobs is not None:
                lps.extend(c.logprobs)
            self.ends[c.index] = c

    def output(self) -> Any:
        if self.last is None:
            return None
        outputs = [
            dataclasses.replace(self.ends[k], text="".join(texts), token_ids=ids, logprobs=lps)
            for k, (texts, ids, lps) in sorted(self.pieces.items())
        ]
        return dataclasses.replace(self.last, outputs=outputs,
                                   prompt_logprobs=self.prompt_logprobs)


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


class UsageCounter:
    """Token counts of a streamed batch, from its deltas (no output is kept)."""

    def __init__(self, num_prompts: int) -> None:
        self.prompt_tokens = [0] * num_prompts
        self.completion_tokens = 0

    def observe(self, i: int, output: Any) -> None:
        self.prompt_tokens[i] = len(output.prompt_token_ids)
        self.completion_tokens += sum(len(c.token_ids) for c in output.outputs)

    def usage(self) -> UsageInfo:
        prompt = sum(self.prompt_tokens)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=self.completion_tokens,
                         total_tokens=prompt + self.completion_tokens)
