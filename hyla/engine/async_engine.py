"""AsyncEngine: the LLMEngine loop in a background thread, one asyncio stream per request.

    event loop (server)                       engine thread
    -------------------                       -------------
    add_request() - ("add", ...) ---------->  commands  -> engine.add_request
               <-- admitted / error --------  (call_soon_threadsafe)
    abort()    --- ("abort", id) ---------->  commands  -> engine.abort_request (frees at once)
    stream queue <- RequestOutput ---------   engine.step() while there is work

Text prompts are tokenized, and token-id prompts checked, in a worker thread before the "add"
command (a multi-megabyte prompt takes seconds to tokenize; on the engine thread it would stall
every running stream); an over-long one is refused there and never reaches the engine. The
engine gets the token ids and the outputs get the text back as `prompt`.

The engine is touched only by the engine thread, so it needs no lock. The thread sleeps on a
condition variable while there is no work and wakes on the next command. Commands are applied
before every step, so a cancelled request's blocks and state slot are free before the next
forward pass. Outputs of requests the loop no longer tracks (cancelled, timed out) are dropped.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from hyla.engine.async_stream import (
    DONE,
    EngineDeadError,
    EngineDrainingError,
    OutputQueue,
    RequestFailedError,
    RequestStream,
    empty_output,
    with_finish_reason,
)
from hyla.engine.validate import prompt_token_ids, validate_lengths
from hyla.request import InvalidRequestError, QueueFullError, RequestOutputKind, SamplingParams

__all__ = [
    "AsyncEngine",
    "EngineDeadError",
    "EngineDrainingError",
    "QueueFullError",
    "RequestStream",
]

logger = logging.getLogger("hyla.engine")


@dataclass
class _Stream:
    """Per-request state, owned by the engine thread except `queue` (event-loop side)."""

    request_id: str
    queue: OutputQueue
    num_outputs: int = 1
    last_output: Any = None
    prompt_text: str | None = None
    finished: set[int] = field(default_factory=set)  # completions whose finish was sent

    @property
    def is_delta(self) -> bool:
        return self.queue.is_delta

    def abort_output(self) -> Any:
        """The final output of a request ended by the shutdown: "abort" for each completion
        not finished yet (as a delta: nothing else), or the last cumulative output so ended."""
        last = self.last_output
        if last is None or self.is_delta:
            return empty_output(self.request_id, self.num_outputs, "abort", self.finished)
        return with_finish_reason(last, "abort")


class AsyncEngine:
    """Runs `LLMEngine.step()` in a background thread and streams outputs to coroutines.

    Timeouts and the queue bound are the engine's (`EngineConfig.request_timeout`: the engine
    ends a request with finish_reason "timeout"; `EngineConfig.max_queue_len`: checked here too,
    before a prompt is tokenized, counting requests admitted but without a first token yet).

    Args:
        engine: an `hyla.engine.llm_engine.LLMEngine` (or anything with the same contract:
            add_request, abort_request, step, has_unfinished_requests, get_stats).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        config = getattr(engine, "config", None)
        self.max_queue_len = getattr(config, "max_queue_len", None)
        self._cond = threading.Condition()
        self._commands: collections.deque[tuple] = collections.deque()
        self._streams: dict[str, _Stream] = {}
        self._num_pending_adds = 0
        self._stats = engine.get_stats()  # refreshed by the engine thread
        self._is_draining = False
        self._is_aborting = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- attributes the server reads -------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def model_name(self) -> str:
        return getattr(self.engine, "model_name", "hyla")

    @property
    def is_draining(self) -> bool:
        return self._is_draining

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def get_stats(self) -> Any:
        """The engine's `EngineStats` as of the end of the last step (thread-safe)."""
        return self._stats

    def num_in_flight(self) -> int:
        """Requests admitted or being admitted and not yet finished."""
        with self._cond:
            return len(self._streams) + self._num_pending_adds

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread (idempotent). Call from inside the event loop."""
        if self.is_running:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="hyla-engine", daemon=True)
        self._thread.start()

    def begin_drain(self) -> None:
        """Stop admitting requests; the running ones go on to finish."""
        self._is_draining = True

    def abort_all(self) -> None:
        """Stop admitting and end every request in flight (thread-safe). Each stream gets a
        final output with finish_reason "abort" (no token yet: one with empty completions),
        then ends; requests still being admitted are refused with EngineDrainingError."""
        with self._cond:
            self._is_draining = self._is_aborting = True
            self._commands.append(("abort_all",))
            self._cond.notify()

    async def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop the engine thread, after the requests in flight finish when `drain`.

        With `drain=False` (or when `timeout` seconds pass) the remaining requests are aborted.
        """
        self.begin_drain()
        if drain:
            start = time.monotonic()
            while self.num_in_flight() and (timeout is None or time.monotonic() - start < timeout):
                await asyncio.sleep(0.02)
        self.abort_all()
        with self._cond:
            self._commands.append(("stop",))
            self._cond.notify()
        # Polled, not joined in a worker thread: every worker may be busy (huge prompts being
        # tokenized) and the join would wait for one of them.
        deadline = time.monotonic() + 10.0
        while self.is_running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._thread = None

    # -- requests ---------------------------------------------------------------------------

    async def add_request(
        self, prompt: str | list[int], params: Any, request_id: str | None = None
    ) -> RequestStream:
        """Submit a request; returns once the engine admitted it.

        Returns: a `RequestStream` of `RequestOutput`s, cumulative or deltas as
        `params.output_kind` says (the last has finished=True).
        Raises: `hyla.request.InvalidRequestError` (bad prompt or params, from
        `LLMEngine.add_request`; nothing stays allocated), QueueFullError, EngineDrainingError.
        """
        request_id = request_id or uuid.uuid4().hex
        text = prompt if isinstance(prompt, str) else None
        if self._can_pretokenize(prompt):
            self._check_admission()  # before paying for the tokenization
            prompt = await asyncio.to_thread(self._tokenize, prompt, params)
        queue = await self._submit(prompt, params, request_id, text)
        return RequestStream(self, request_id, queue)

    def _can_pretokenize(self, prompt: Any) -> bool:
        vocab = getattr(getattr(self.engine, "model_config", None), "vocab_size", None)
        if not isinstance(vocab, int):
            return False
        return isinstance(prompt, (list, tuple)) or (
            isinstance(prompt, str) and self.tokenizer is not None
        )

    def _tokenize(self, text: str | list[int], params: Any) -> list[int]:
        """Token ids of `text` (or `text` as checked token ids) as the engine would compute
        them, in a worker thread: the engine thread does not check them again.

        Raises: InvalidRequestError("prompt") for text that cannot be tokenized or leaves no
            room in the context window; InvalidRequestError("max_tokens") past the window.
        """
        ids = prompt_token_ids(text, self.tokenizer, self.engine.model_config.vocab_size)
        if isinstance(params, SamplingParams):
            validate_lengths(len(ids), params, self.max_model_len)
        return ids

    async def generate(
        self, prompt: str | list[int], params: Any, request_id: str | None = None
    ) -> AsyncIterator[Any]:
        """Submit a request and yield its `RequestOutput`s until it finishes.

        Raises the errors of `add_request` (on the first iteration) and EngineDeadError if a
        step fails mid-stream. Closing or cancelling the iterator aborts the request: its
        blocks and state slot are freed before the next step.
        """
        stream = await self.add_request(prompt, params, request_id)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    def _check_admission(self) -> None:
        """Raises EngineDrainingError while draining, QueueFullError when the queue is full."""
        if self._is_draining:
            raise EngineDrainingError("the server is shutting down")
        with self._cond:
            limit = self.max_queue_len
            if limit is not None and self._num_waiting_locked() >= limit:
                raise QueueFullError(limit)

    async def _submit(
        self, prompt: Any, params: Any, request_id: str, text: str | None = None
    ) -> OutputQueue:
        self._check_admission()
        if not self.is_running:
            self.start()
        with self._cond:
            limit = self.max_queue_len
            if limit is not None and self._num_waiting_locked() >= limit:
                raise QueueFullError(limit)
            loop = asyncio.get_running_loop()
            admitted: asyncio.Future = loop.create_future()
            queue = OutputQueue(getattr(params, "output_kind", None) is RequestOutputKind.DELTA)
            self._num_pending_adds += 1
            self._commands.append(("add", request_id, prompt, params, queue, admitted, text))
            self._cond.notify()
        try:
            await asyncio.shield(admitted)
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return queue

    def _num_waiting_locked(self) -> int:
        # Waiting = admitted or being admitted, but no token yet. Counted here rather than read
        # from the engine's stats, which lag a step behind a burst of arrivals.
        no_output = sum(1 for s in self._streams.values() if s.last_output is None)
        return self._num_pending_adds + no_output

    def abort(self, request_id: str) -> None:
        """Cancel a request (thread-safe; unknown or finished ids are ignored)."""
        with self._cond:
            self._commands.append(("abort", request_id))
            self._cond.notify()

    # -- engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            commands = self._wait_for_work()
            stop = any(c[0] == "stop" for c in commands)
            try:
                self._iterate([c for c in commands if c[0] != "stop"], stop)
            except Exception as e:
                # Never let the thread die: its requests would hang with no output and no end.
                logger.exception("engine loop failed; ending %d requests", len(self._streams))
                self._fail_all(EngineDeadError(f"engine loop failed: {type(e).__name__}: {e}"))
            if stop:
                return

    def _iterate(self, commands: list[tuple], stop: bool) -> None:
        self._apply(commands)
        if stop:
            self._update_snapshot()
            return
        if commands:
            self._update_snapshot()
        if self.engine.has_unfinished_requests():
            self._step()
            self._update_snapshot()

    def _wait_for_work(self) -> list[tuple]:
        with self._cond:
            while not self._commands and not self._has_work():
                self._cond.wait()
            commands = list(self._commands)
            self._commands.clear()
        return commands

    def _has_work(self) -> bool:
        # Unfinished requests without a stream too (aborted after a failed step or a cancelled
        # stream): one more step collects them, so an idle engine holds no request.
        return self.engine.has_unfinished_requests()

    def _apply(self, commands: Any) -> None:
        for command in commands:
            if command[0] == "add":
                self._add(*command[1:])
            elif command[0] == "abort":
                self._abort(command[1])
            elif command[0] == "abort_all":
                for request_id in list(self._streams):
                    self._abort(request_id, shutdown=True)

    def _add(self, request_id, prompt, params, queue, admitted, text) -> None:  # noqa: ANN001
        arrival = time.monotonic()
        try:
            if self._is_aborting:
                raise EngineDrainingError("the server is shutting down")
            if request_id in self._streams:
                raise InvalidRequestError("request_id", f"duplicate request id {request_id!r}")
            self.engine.add_request(request_id, prompt, params, arrival_time=arrival)
        except Exception as e:  # handed to the caller, which maps it to an HTTP status
            with self._cond:
                self._num_pending_adds -= 1
            self._call(_set_exception, admitted, e)
            return
        with self._cond:
            self._num_pending_adds -= 1
            num_outputs = getattr(params, "n", 1) or 1
            self._streams[request_id] = _Stream(request_id, queue, num_outputs, prompt_text=text)
        self._call(_set_result, admitted)

    def _abort(self, request_id: str, shutdown: bool = False) -> None:
        """End a request: a client's cancel just ends its stream (nobody reads a final output);
        at shutdown the stream first gets a final output with finish_reason "abort"."""
        stream = self._streams.get(request_id)
        try:
            self.engine.abort_request(request_id)
        except Exception:  # the stream still ends; the engine finishes the request on its own
            logger.exception("abort of %s raised", request_id)
        if stream is None:
            return
        with self._cond:
            del self._streams[request_id]
        if shutdown:
            self._put(stream, stream.abort_output())
        self._put(stream, DONE)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            logger.exception("engine step failed; ending %d requests", len(self._streams))
            self._fail_all(EngineDeadError(f"engine step failed: {type(e).__name__}: {e}"))
            return
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            if stream.prompt_text is not None and output.prompt is None:
                output.prompt = stream.prompt_text  # a fresh object per step: safe to set
            stream.last_output = output
            stream.finished.update(c.index for c in output.outputs if c.finish_reason)
            errors = [o.stop_reason for o in output.outputs if o.finish_reason == "error"]
            self._put(stream, RequestFailedError(str(errors[0])) if errors else output)
            if errors and not output.finished:  # one of its n sequences failed: end them all
                self._abort(output.request_id)
            elif output.finished:
                with self._cond:
                    self._streams.pop(output.request_id, None)

    def _fail_all(self, error: Exception) -> None:
        for request_id in list(self._streams):
            stream = self._streams[request_id]
            try:
                self.engine.abort_request(request_id)
            except Exception:
                logger.exception("abort of %s after a failed step raised", request_id)
            with self._cond:
                self._streams.pop(request_id, None)
            self._put(stream, error)

    def _put(self, stream: _Stream, item: Any) -> None:
        self._call(stream.queue.put_nowait, item)

    def _call(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed under us (interpreter shutdown)
            pass

    def _update_snapshot(self) -> None:
        try:
            stats = self.engine.get_stats()
        except Exception:
            logger.exception("get_stats failed")
            return
        self._stats = stats


def _set_result(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _set_exception(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
