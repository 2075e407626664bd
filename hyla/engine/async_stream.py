"""Per-request output streams of the AsyncEngine and its errors; a stream ends with `DONE`
(abort) or an exception (failed step)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from hyla.request import CompletionOutput, RequestMetrics, RequestOutput

DONE = object()


class EngineDrainingError(RuntimeError):
    """The engine is shutting down and admits no new requests."""


class EngineDeadError(RuntimeError):
    """A step raised; the requests in flight were ended with this error."""


class RequestFailedError(EngineDeadError):
    """This request ended with finish reason "error"; the other requests go on."""


class OutputQueue:
    """One request's outputs on the event loop (not thread-safe). A new output joins an unread
    unfinished one (replaces it, or `add`s to it as a DELTA), so a slow consumer costs O(length)
    memory, not one output per step."""

    def __init__(self, is_delta: bool = False) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self.is_delta = is_delta

    def put_nowait(self, item: Any) -> None:
        items = self._items
        last = items[-1] if items else None
        if (
            isinstance(item, RequestOutput)
            and isinstance(last, RequestOutput)
            and (not last.finished)
        ):
            if self.is_delta:
                last.add(item)
            else:
                items[-1] = item
        else:
            items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def qsize(self) -> int:
        return len(self._items)


class RequestStream:
    """Async iterator over one request's outputs; `abort()`, cancelling or dropping it aborts."""

    def __init__(self, engine: Any, request_id: str, queue: OutputQueue) -> None:
        self.engine = engine
        self.request_id = request_id
        self._queue = queue
        self.is_finished = False

    @property
    def num_pending(self) -> int:
        return self._queue.qsize()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Any:
        if self.is_finished:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:
            self.abort()
            raise
        if item is DONE:
            self.is_finished = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.is_finished = True
            raise item
        self.is_finished = item.finished
        return item

    def abort(self) -> None:
        if not self.is_finished:
            self.is_finished = True
            self.engine.abort(self.request_id)

    def __del__(self) -> None:
        if not self.is_finished:
            try:
                self.engine.abort(self.request_id)
            except Exception:  # interpreter shutdown
                pass


def with_finish_reason(output: RequestOutput, reason: str) -> RequestOutput:
    outputs = [
        dataclasses.replace(o, finish_reason=o.finish_reason or reason) for o in output.outputs
    ]
    return dataclasses.replace(output, outputs=outputs, finished=True)


def empty_output(
    request_id: str, num_outputs: int, reason: str, finished: set[int] | frozenset = frozenset()
) -> RequestOutput:
    """The final output of a request ended before its first token (or a DELTA: nothing new)."""
    outputs = [
        CompletionOutput(index=k, text="", token_ids=[], logprobs=None, cumulative_logprob=None,
                         finish_reason=reason, stop_reason=None)
        for k in range(num_outputs)
        if k not in finished
    ]
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[],
                         prompt_logprobs=None, outputs=outputs, finished=True,
                         metrics=RequestMetrics(arrival_time=time.monotonic()))


@dataclass
class StreamState:
    """One request on the event loop: its queue, and what the core leaves out of its outputs
    (prompt text, prompt ids after the first, the text when `text` is an `OutputText`)."""

    request_id: str
    queue: OutputQueue
    num_outputs: int = 1
    last_output: Any = None
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    text: Any = None
    finished: set[int] = field(default_factory=set)

    def take(self, output: RequestOutput) -> bool:
        """Fill in and queue `output` (or a completion's error); returns whether one failed."""
        if self.prompt_text is not None and output.prompt is None:
            output.prompt = self.prompt_text
        if output.prompt_token_ids is None:
            output.prompt_token_ids = self.prompt_token_ids
        else:
            self.prompt_token_ids = output.prompt_token_ids
        if self.text is not None:
            self.text.fill(output)
        self.last_output = output
        self.finished.update(c.index for c in output.outputs if c.finish_reason)
        errors = [o.stop_reason for o in output.outputs if o.finish_reason == "error"]
        self.queue.put_nowait(RequestFailedError(str(errors[0])) if errors else output)
        return bool(errors)

    def abort_output(self) -> RequestOutput:
        last = self.last_output
        if last is None or self.queue.is_delta:
            return empty_output(self.request_id, self.num_outputs, "abort", self.finished)
        return with_finish_reason(last, "abort")
