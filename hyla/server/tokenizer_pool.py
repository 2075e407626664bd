"""Large requests are validated, rendered and tokenized in worker processes (issue 18).

For a chat request of 100k messages, pydantic validation, Jinja rendering and tokenization take
about a second each on one core, and the prefix cache's block hashes of a 500k-token prompt
about 0.1 s; all of it but the tokenization holds the GIL (bench/host_phases_cpu.py).
In the server's process that work stalls the engine thread, i.e. every running stream, for as
long as it holds the GIL. A request whose body has `min_bytes` or more goes to a worker process
instead (`prepare_chat`, `prepare_completion`: the whole body validated by the same pydantic
model, the conversation rendered by the same chat template, tokenized by a copy of the same
tokenizer, token ids checked against the vocabulary, block hashes computed), and comes back as
token ids in one bytes object. The server process then swaps the prompt in its parsed body for
a stub (`swap_in_stub`) so that FastAPI's validation of the rest is cheap, and the route uses
the worker's outcome where it would have rendered: every check and error happens in the same
order, with the same message.

    event loop                                worker process (tokenizer unpickled once)
    size gate (limits.py)
    body >= min_bytes  --- body bytes ----->  json.loads, validate, render, tokenize, check ids,
                                              hash blocks
    422 (as FastAPI's) <-- Outcome ---------
    stub prompt; FastAPI validates the rest; the route raises the worker's error or admits its ids

A worker that dies (killed, out of memory), or a request not prepared within `timeout` seconds
(a hung worker: the pool's workers are killed), fails the requests that pool was serving with
503 `tokenizer_pool_failed` (retryable, as a dead worker: the server is fine, its pool is
replaced) and the next request gets a new pool. A pool that cannot prepare anything gives up:
when a pool fails before any worker became ready (the tokenizer does not load in the worker,
no processes), or after `max_failures` failures in a row, that request and every later one are
prepared in-process, as without a pool (logged once). `close()` (app shutdown) ends the
workers, and a worker ends with the server process if that is killed. Vision models keep the
in-process path (images are fetched and processed beside the engine).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyla.server.errors import APIError

logger = logging.getLogger("hyla.server")

POOL_MIN_BYTES = 64 << 10  # ~50 ms of host work for a chat body: above that, a worker pays off
POOL_TIMEOUT = 60.0  # s; the largest body (8 MiB) takes a few seconds: past this, it is hung
POOL_MAX_FAILURES = 3  # pools failed in a row before requests are prepared in-process
STUB_MESSAGES = [{"role": "user", "content": ""}]
STUB_PROMPT = [0]
_SCALARS = (str, int, float, bool, type(None))
_tokenizer: Any = None  # the worker process's copy, set once by `_init_worker`
# Held off while a worker is spawned (the worker starts with them blocked, `_init_worker` lets
# them in): the spawning thread writes the pickled tokenizer into a pipe whose read end it holds
# itself, so a worker killed by a Ctrl-C to the process group before it read all of it left
# the server blocked in multiprocessing's `Popen._launch` for good (issue 41).
SPAWN_BLOCKED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@dataclass(frozen=True)
class Outcome:
    """What a worker made of one request: pydantic `errors` (FastAPI's 422), an `error` the
    route raises where it would have rendered (status, message, param, code), or `prompts`, one
    per prompt: text, token ids outside the vocabulary as a list (the engine refuses them), or
    (int64 bytes, block_size, block hashes or None) for ids in it."""

    errors: list[dict] | None = None
    error: tuple[int, str, str | None, str | None] | None = None
    prompts: list[tuple[bytes, int, list[int] | None] | str | list] | None = None

    def prompt_list(self, vocab_size: int | None) -> list[Any]:
        """The prompts as the in-process path hands them to the engine. Raises `error`."""
        if self.error is not None:
            status, message, param, code = self.error
            raise APIError(status, message, param=param, code=code)
        return [_decode(p, vocab_size) for p in self.prompts or []]


def _decode(prompt: Any, vocab_size: int | None) -> Any:
    from hyla.engine.validate import TokenIds

    if not isinstance(prompt, tuple):
        return prompt
    data, block_size, block_hashes = prompt
    out = TokenIds(np.frombuffer(data, dtype=np.int64).tolist())
    out.vocab_size = vocab_size  # checked in the worker: the engine does not check them again
    if block_hashes is not None:  # hashed in the worker: the engine thread hashes nothing
        out.block_size, out.block_hashes = block_size, block_hashes
    return out


class TokenizerPool:
    """`size` worker processes, each with a copy of `tokenizer` (pickled once per worker).

    Args:
        tokenizer: the engine's tokenizer (None: a model served by token ids only).
        size: worker processes (>= 1).
        min_bytes: bodies of at least this many bytes use the pool (`wants`).
        timeout: seconds a request may wait for its worker (queue included) before the pool
            counts as hung.
        max_failures: failed pools in a row (dead or hung workers) before the pool gives up.
    """

    def __init__(
        self, tokenizer: Any, size: int = 1, min_bytes: int = POOL_MIN_BYTES,
        timeout: float = POOL_TIMEOUT, max_failures: int = POOL_MAX_FAILURES,
    ) -> None:  # fmt: skip
        if size < 1:
            raise ValueError(f"tokenizer_pool_size: must be >= 1, got {size}")
        if not timeout > 0 or max_failures < 1:
            raise ValueError(f"timeout must be > 0 and max_failures >= 1, got {timeout}, "
                             f"{max_failures}")  # fmt: skip
        self.tokenizer, self.size, self.min_bytes = tokenizer, size, min_bytes
        self.timeout, self.max_failures = timeout, max_failures
        self.gave_up = False  # the pool cannot prepare anything: every request in-process
        self._failures = 0  # pools failed since the last request a worker prepared
        self._executor: ProcessPoolExecutor | None = None
        self._warmup: list[Future] = []  # the current executor's: done without error = ready
        self._retired: list[ProcessPoolExecutor] = []

    def wants(self, num_bytes: int) -> bool:
        return not self.gave_up and num_bytes >= self.min_bytes

    def start(self) -> None:
        """Spawn the workers now (app startup), so the first large request does not wait."""
        self._current()

    async def prepare_chat(
        self, body: bytes, vocab_size: int | None, block_size: int | None = None
    ) -> Outcome | None:
        """The worker's outcome; None: the pool gave up, prepare the request in-process."""
        return await self._run_or_none(prepare_chat, body, vocab_size, block_size)

    async def prepare_completion(
        self, body: bytes, vocab_size: int | None, block_size: int | None = None
    ) -> Outcome | None:
        """As `prepare_chat`, for a completion body."""
        return await self._run_or_none(prepare_completion, body, vocab_size, block_size)

    async def run(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` in a worker (`fn` picklable by reference). Raises APIError 503
        `tokenizer_pool_failed` when the worker dies or `timeout` passes, PoolGaveUp when the
        pool gives up (now or before).

        A request whose pool failed for another's doing (a worker that died while idle,
        another request that hung) is not failed with it: it runs again, once, on the new
        pool.
        """
        for attempt in range(2):
            if self.gave_up:
                raise PoolGaveUp
            executor = self._current()
            try:
                return await self._run_on(executor, fn, args)
            except _Collateral:
                if attempt == 1:
                    raise _pool_error("the tokenizer pool failed twice while this request "
                                      "waited") from None  # fmt: skip
        raise AssertionError("unreachable")

    async def _run_on(self, executor: ProcessPoolExecutor, fn: Any, args: tuple) -> Any:
        try:
            future = executor.submit(fn, *args)
        except BrokenProcessPool:  # broke before this request: a worker died while idle
            self._failed(executor, "a worker died while idle")
            raise _Collateral from None
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if future.cancelled() and task is not None and not task.cancelling():
                raise _Collateral from None  # dropped from the queue of a pool retired since
            raise
        except BrokenProcessPool as e:
            if self._executor is not executor:  # retired for another request's failure
                raise _Collateral from None
            self._failed(executor, "a worker died")
            raise _pool_error("the tokenizer pool's worker process died while preparing this "
                              "request") from e  # fmt: skip
        except TimeoutError as e:
            if self._executor is not executor:  # it waited behind the request that hung
                raise _Collateral from None
            self._failed(executor, f"a request was not prepared within {self.timeout:g} s")
            raise _pool_error(f"the tokenizer pool did not prepare this request within "
                              f"{self.timeout:g} s") from e  # fmt: skip
        if self._executor is executor:
            self._failures = 0
        return result

    async def _run_or_none(self, fn: Any, *args: Any) -> Outcome | None:
        try:
            return await self.run(fn, *args)
        except PoolGaveUp:
            return None

    def worker_pids(self) -> list[int]:
        """Pids of the live workers (for tests and logs)."""
        executors = [*self._retired, *([self._executor] if self._executor else [])]
        procs = [p for e in executors for p in (getattr(e, "_processes", None) or {}).values()]
        return [p.pid for p in procs if p.is_alive()]

    def close(self, timeout: float = 1.0) -> None:
        """Cancel queued work and end every worker: an idle one exits at once, a busy one (its
        request is not admitted any more) is killed after `timeout` seconds."""
        executors = [*self._retired, *([self._executor] if self._executor else [])]
        self._executor, self._retired, self._warmup = None, [], []
        for executor in executors:
            procs = list((getattr(executor, "_processes", None) or {}).values())
            executor.shutdown(wait=False, cancel_futures=True)
            for proc in procs:
                proc.join(timeout)
                if proc.is_alive():
                    proc.kill()
                    proc.join(1.0)
            # workers gone: the manager thread ends at once; joining it lets its queues be
            # freed here, since the server exits by os._exit, which skips the finalizers that
            # unlink their semaphores (the resource tracker then warned of 5 leaked ones)
            executor.shutdown(wait=True)
        executors.clear()
        gc.collect()

    def _current(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # spawn: the server process has threads (engine, torch), which fork would copy
            # in whatever state they are in.
            self._executor = ProcessPoolExecutor(
                self.size, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(self.tokenizer,),
            )  # fmt: skip
            # queued first: done before any request unless no worker gets through its start;
            # submit() spawns the workers (in this thread)
            with _signals_blocked():
                self._warmup = [self._executor.submit(int) for _ in range(self.size)]
        return self._executor

    def _failed(self, executor: ProcessPoolExecutor, why: str) -> None:
        """Retire `executor` (its workers killed: a hung one would never end) once, for the
        first request that saw it fail; give up when it never got a worker ready or pools
        failed `max_failures` times in a row. Raises PoolGaveUp then."""
        if self._executor is executor:
            ready = any(f.done() and not f.cancelled() and f.exception() is None
                        for f in self._warmup)  # fmt: skip
            self._executor, self._warmup = None, []
            self._failures += 1
            _kill_workers(executor)
            executor.shutdown(wait=False, cancel_futures=True)
            self._retired = [e for e in [*self._retired, executor] if _has_live_workers(e)]
            if not ready or self._failures >= self.max_failures:
                self.gave_up = True
                logger.error("tokenizer pool: %s, %s; large requests are prepared in-process "
                             "from now on", why, "its workers never became ready" if not ready
                             else f"{self._failures} pools failed in a row")  # fmt: skip
                self.close()
            else:
                logger.error("tokenizer pool: %s; starting a new pool", why)
        if self.gave_up:
            raise PoolGaveUp


class PoolGaveUp(Exception):
    """The pool cannot prepare anything: prepare the request in-process."""


class _Collateral(Exception):
    """A request's pool failed, but not because of that request: run it on the next pool."""


def _pool_error(what: str) -> APIError:
    return APIError(503, f"{what}; retry it", code="tokenizer_pool_failed",
                    headers={"Retry-After": "1"})  # fmt: skip


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """SPAWN_BLOCKED_SIGNALS blocked in this thread (and in the processes it spawns); one that
    arrives meanwhile is handled by another thread of the process, or here when unblocked."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SPAWN_BLOCKED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _kill_workers(executor: ProcessPoolExecutor) -> None:
    for proc in (getattr(executor, "_processes", None) or {}).values():
        if proc.is_alive():
            proc.kill()


def _has_live_workers(executor: ProcessPoolExecutor) -> bool:
    return any(p.is_alive() for p in (getattr(executor, "_processes", None) or {}).values())


def swap_in_stub(data: dict, field: str) -> None:
    """Replace the prompt of a parsed body the worker prepared with a one-item stub, so that
    FastAPI's validation of the same dict (next) skips it."""
    data[field] = STUB_MESSAGES if field == "messages" else STUB_PROMPT


# -- worker process ---------------------------------------------------------------------------


def _init_worker(tokenizer: Any) -> None:
    global _tokenizer
    _tokenizer = tokenizer
    # Ctrl-C in a terminal signals the whole process group: the server drains and closes the
    # pool; a worker interrupted inside the executor's queue read only printed a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a blocked one pending is discarded
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SPAWN_BLOCKED_SIGNALS)
    parent = multiprocessing.parent_process()
    if parent is not None:  # a server killed by SIGKILL closes no pool: end with it anyway
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)


def prepare_chat(body: bytes, vocab_size: int | None, block_size: int | None = None) -> Outcome:
    """A chat body validated, rendered and tokenized as `api.create_chat_completion` does;
    `block_size` (prefix caching on): the prompt's block hashes too."""
    from hyla.server import convert
    from hyla.server.protocol import ChatCompletionRequest

    return _prepare(body, ChatCompletionRequest, lambda req: [
        _encode(convert.chat_prompt_ids(_tokenizer, req), vocab_size, block_size)])  # fmt: skip


def prepare_completion(
    body: bytes, vocab_size: int | None, block_size: int | None = None
) -> Outcome:
    """A completion body validated and its prompts normalized as `api.create_completion` does
    (text stays text: the engine tokenizes it in a thread, mostly without the GIL)."""
    from hyla.server import convert
    from hyla.server.protocol import CompletionRequest

    return _prepare(body, CompletionRequest, lambda req: [
        p if isinstance(p, str) else _encode(p, vocab_size, block_size)
        for p in convert.normalize_prompts(req.prompt)
    ])  # fmt: skip


def _prepare(body: bytes, model: Any, make_prompts: Any) -> Outcome:
    from pydantic import ValidationError

    try:
        req = model.model_validate(json.loads(body))
    except ValidationError as e:
        return Outcome(errors=[_plain_error(err) for err in e.errors(include_url=False)])
    try:
        return Outcome(prompts=make_prompts(req))
    except APIError as e:
        return Outcome(error=(e.status, e.message, e.param, e.code))
    except Exception as e:  # as `errors.to_api_error` answers an unexpected error
        logger.error("tokenizer pool: unexpected error", exc_info=True)
        return Outcome(error=(500, f"internal error: {type(e).__name__}", None, "internal_error"))


def _encode(
    ids: list[Any], vocab_size: int | None, block_size: int | None
) -> tuple[bytes, int, list[int] | None] | list:
    """Token ids in [0, vocab_size) as int64 bytes with their block hashes (`block_size`
    None: none); ids that are not go back as they are, for the engine to refuse with its own
    error."""
    from hyla.cache.prefix import extend_block_hashes
    from hyla.engine.validate import prompt_token_ids
    from hyla.request import InvalidRequestError

    if vocab_size is None:
        return list(ids)
    try:
        prompt_token_ids(ids, None, vocab_size)
    except InvalidRequestError:
        return list(ids)
    hashes = extend_block_hashes([], ids, block_size) if block_size else None
    return np.asarray(ids, dtype=np.int64).tobytes(), block_size or 0, hashes


def _plain_error(error: dict) -> dict:
    """A pydantic error as FastAPI reports it (under "body"), with picklable context."""
    ctx = {k: v if isinstance(v, _SCALARS) else str(v) for k, v in error.get("ctx", {}).items()}
    out = {**error, "loc": ("body", *error["loc"])}
    if ctx:
        out["ctx"] = ctx
    return out
