"""AsyncEngine: the engine's asyncio front end, one stream per request. The core (a thread, or
a process for `hyla serve`) gets "add"/"abort"/"call" commands before every step and sends back
"admitted"/"rejected"/"outputs" events; prompts are tokenized in a worker thread first."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hyla.engine.async_stream import (
    DONE,
    EngineDeadError,
    EngineDrainingError,
    OutputQueue,
    RequestStream,
    StreamState,
)
from hyla.engine.core_loop import ThreadCore
from hyla.engine.output_text import OutputText, front_detokenized
from hyla.engine.validate import prompt_token_ids, validate_lengths
from hyla.request import (
    InvalidRequestError,
    QueueFullError,
    RequestOutputKind,
    SamplingParams,
)

__all__ = [
    "AsyncEngine",
    "EngineDeadError",
    "EngineDrainingError",
    "QueueFullError",
    "RequestStream",
]

logger = logging.getLogger("hyla.engine")


@dataclass
class _Pending:
    future: asyncio.Future
    stream: StreamState


class AsyncEngine:
    """Streams a core's outputs to coroutines; `max_queue_len` is also checked here, before
    tokenizing. `engine`: an `LLMEngine` or a core process's `EngineInfo`; `core`: None for a
    `ThreadCore(engine)`."""

    def __init__(self, engine: Any, core: Any = None) -> None:
        self.engine = engine
        self.core = ThreadCore(engine) if core is None else core
        config = getattr(engine, "config", None)
        self.max_queue_len = getattr(config, "max_queue_len", None)
        self._streams: dict[str, StreamState] = {}
        self._pending: dict[str, _Pending] = {}
        self._calls: dict[str, asyncio.Future] = {}
        self._stats = engine.get_stats()
        self._is_draining = False
        self._is_aborting = False
        self._is_stopped = False
        self._dead: Exception | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_process(cls, model: str | None, options: dict[str, Any]) -> AsyncEngine:
        """Load `model` in an engine-core process of its own (`hyla.engine.core_process`)."""
        from hyla.engine.core_process import ProcessCore

        core = ProcessCore(model, options)
        return cls(core.info, core)

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
        return self._loop is not None and not self._is_stopped and self.core.is_running

    def get_stats(self) -> Any:
        return self._stats

    def num_in_flight(self) -> int:
        return len(self._streams) + len(self._pending)

    def check_health(self) -> None:
        """Raises when the engine's process or a tensor-parallel rank is gone."""
        self.core.check_health()

    def start(self) -> None:
        """Start the core (idempotent), from inside the event loop."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.core.start(self._on_event, self._loop)

    def begin_drain(self) -> None:
        self._is_draining = True

    def abort_all(self) -> None:
        """Stop admitting; each stream gets a final "abort" output, pending requests
        EngineDrainingError."""
        if not self._on_loop():
            self._loop.call_soon_threadsafe(self.abort_all)
            return
        self._is_draining = self._is_aborting = True
        for request_id in list(self._streams):
            self._end(request_id, shutdown=True)
        for request_id in list(self._pending):
            self._refuse(request_id, EngineDrainingError("the server is shutting down"))

    async def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop the core; with `drain`, after the requests in flight finish (or `timeout`)."""
        self.begin_drain()
        if drain:
            start = time.monotonic()
            while self.num_in_flight() and (timeout is None or time.monotonic() - start < timeout):
                await asyncio.sleep(0.02)
        if self._loop is None:
            return
        self.abort_all()
        self.core.send(("stop",))
        deadline = time.monotonic() + 10.0  # polled: a join could wait on a busy worker thread
        while self.core.is_running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._is_stopped = True
        close = getattr(self.core, "close", None)
        if close is not None:
            close()

    async def add_request(
        self, prompt: str | list[int], params: Any, request_id: str | None = None
    ) -> RequestStream:
        """Submit a request; returns its `RequestStream` once the engine admitted it.

        Raises: InvalidRequestError (nothing stays allocated), QueueFullError, EngineDrainingError.
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
        ids = prompt_token_ids(text, self.tokenizer, self.engine.model_config.vocab_size)
        if isinstance(params, SamplingParams):
            validate_lengths(len(ids), params, self.max_model_len)
        return ids

    async def generate(
        self, prompt: str | list[int], params: Any, request_id: str | None = None
    ) -> AsyncIterator[Any]:
        """Yield a request's `RequestOutput`s; closing the iterator aborts it. Raises
        `add_request`'s errors, or EngineDeadError mid-stream."""
        stream = await self.add_request(prompt, params, request_id)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    def _check_admission(self) -> None:
        if self._is_draining:
            raise EngineDrainingError("the server is shutting down")
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        limit = self.max_queue_len
        if limit is not None and self._num_waiting() >= limit:
            raise QueueFullError(limit)

    async def _submit(
        self, prompt: Any, params: Any, request_id: str, text: str | None = None
    ) -> OutputQueue:
        self._check_admission()
        self.start()
        if request_id in self._streams or request_id in self._pending:
            raise InvalidRequestError("request_id", f"duplicate request id {request_id!r}")
        queue = OutputQueue(getattr(params, "output_kind", None) is RequestOutputKind.DELTA)
        num_outputs = getattr(params, "n", 1) or 1
        stream = StreamState(request_id, queue, num_outputs, prompt_text=text)
        core_params = front_detokenized(params, self.tokenizer) if self.core.text_in_front else None
        if core_params is not None:
            stream.text, params = OutputText(self.tokenizer, params), core_params
        admitted = self._loop.create_future()
        self._pending[request_id] = _Pending(admitted, stream)
        self.core.send(("add", request_id, prompt, params, time.monotonic()))
        try:
            await asyncio.shield(admitted)
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return queue

    def _num_waiting(self) -> int:
        # Counted here: the engine's stats lag a step behind a burst of arrivals.
        no_output = sum(1 for s in self._streams.values() if s.last_output is None)
        return len(self._pending) + no_output

    def abort(self, request_id: str) -> None:
        """Cancel a request (thread-safe; unknown or finished ids are ignored)."""
        if self._loop is None:
            return
        if not self._on_loop():
            try:
                self._loop.call_soon_threadsafe(self.abort, request_id)
            except RuntimeError:  # the loop is closed: nothing is left to abort
                pass
            return
        if request_id in self._streams:
            self._end(request_id)
        elif request_id in self._pending:
            pending = self._pending.pop(request_id)
            pending.future.cancel()
            self._send_abort(request_id)

    async def call(self, fn: Any, *args: Any) -> Any:
        """`fn(engine, *args)` run by the core between two steps (`fn` a module-level function,
        `args` picklable); its result, or its exception raised here."""
        self.start()
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        call_id = uuid.uuid4().hex
        future = self._loop.create_future()
        self._calls[call_id] = future
        self.core.send(("call", call_id, fn, args))
        return await future

    def _on_event(self, event: tuple) -> None:
        kind = event[0]
        if kind == "outputs":
            self._on_outputs(event[1])
            if event[2] is not None:
                self._stats = event[2]
        elif kind == "admitted":
            self._on_admitted(event[1])
        elif kind == "rejected":
            pending = self._pending.pop(event[1], None)
            if pending is not None and not pending.future.done():
                pending.future.set_exception(event[2])
        elif kind == "called":
            self._on_called(*event[1:])
        elif kind == "failed":
            self._fail_all(event[1])
        elif kind == "dead":
            self._dead = event[1]
            self._fail_all(event[1])
            for request_id in list(self._pending):
                self._refuse(request_id, event[1])
            for call_id in list(self._calls):
                self._on_called(call_id, None, event[1], None)

    def _on_called(self, call_id: str, result: Any, error: Any, stats: Any) -> None:
        if stats is not None:
            self._stats = stats
        future = self._calls.pop(call_id, None)
        if future is None or future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _on_admitted(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is None:  # cancelled meanwhile: its abort is on its way
            return
        if self._is_aborting:
            self._send_abort(request_id)
            if not pending.future.done():
                pending.future.set_exception(EngineDrainingError("the server is shutting down"))
            return
        self._streams[request_id] = pending.stream
        if not pending.future.done():
            pending.future.set_result(None)

    def _on_outputs(self, outputs: list[Any]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            failed = stream.take(output)
            if failed and not output.finished:  # one of its n sequences failed: end them all
                self._end(output.request_id)
            elif output.finished:
                self._streams.pop(output.request_id, None)

    def _end(self, request_id: str, shutdown: bool = False) -> None:
        # Only at shutdown does anyone read a final "abort" output.
        stream = self._streams.pop(request_id)
        self._send_abort(request_id)
        if shutdown:
            stream.queue.put_nowait(stream.abort_output())
        stream.queue.put_nowait(DONE)

    def _refuse(self, request_id: str, error: Exception) -> None:
        pending = self._pending.pop(request_id)
        self._send_abort(request_id)
        if not pending.future.done():
            pending.future.set_exception(error)

    def _send_abort(self, request_id: str) -> None:
        if self._dead is None:
            self.core.send(("abort", request_id))

    def _fail_all(self, error: Exception) -> None:
        for request_id in list(self._streams):
            self._streams.pop(request_id).queue.put_nowait(error)

    def _on_loop(self) -> bool:
        loop = self._loop
        if loop is None:
            return True
        try:
            return asyncio.get_running_loop() is loop
        except RuntimeError:
            return threading.current_thread() is threading.main_thread() and not loop.is_running()
