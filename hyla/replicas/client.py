"""The front end of N replicas, with the interface the server uses of an `AsyncEngine`. Prompts
are tokenized and block-hashed here (as the replicas' prefix caches hash them) for the router;
one poll loop per replica feeds the requests' queues, and a dead replica rejoins empty."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hyla.cache.prefix import extend_block_hashes
from hyla.engine.async_stream import (
    DONE,
    EngineDeadError,
    EngineDrainingError,
    OutputQueue,
    RequestStream,
)
from hyla.engine.validate import prompt_token_ids, validate_lengths
from hyla.replicas.launch import ReplicaSet
from hyla.replicas.metrics import ReplicaCollector, health
from hyla.replicas.router import NoReplicaError, Router, RouterConfig
from hyla.replicas.wire import Report, from_wire
from hyla.request import InvalidRequestError, RequestOutputKind, SamplingParams

logger = logging.getLogger("hyla.replicas")

POLL_TIMEOUT = 0.5  # seconds a poll waits on an idle replica
RESTART_POLL = 0.5  # seconds between two `ready` calls to a replica that died


@dataclass(frozen=True)
class CacheInfo:
    block_size: int
    prefix: bool | None  # None: prefix caching off (the server hashes no prompt blocks)


@dataclass(frozen=True)
class EngineInfo:
    """What the server reads of `async_engine.engine`, from replica 0."""

    config: Any
    model_config: Any
    cache: CacheInfo
    tokenizer: Any
    multimodal: None = None
    executor: None = None


@dataclass
class _Open:
    replica: int
    queue: OutputQueue
    text: str | None


class ReplicaClient:
    """Routes requests over the replicas of `replicas`; one instance per event loop."""

    def __init__(self, replicas: ReplicaSet, router_config: RouterConfig | None = None,
                 close_replicas: bool = False) -> None:  # fmt: skip
        info = replicas.info
        if info.get("is_multimodal"):
            raise ValueError("data_parallel_size: replicas serve text-only models for now")
        self.replicas = replicas
        self.close_replicas = close_replicas
        self.actors = replicas.actors
        self.block_size = info["block_size"]
        self.is_prefix_caching = info["is_prefix_caching"]
        self._poller_id = uuid.uuid4().hex  # a replica gives its events to the newest poller
        self.router = Router(len(self.actors), self.block_size, info["checkpoint_stride"],
                             router_config or RouterConfig())  # fmt: skip
        self.engine = EngineInfo(
            info["config"], info["model_config"],
            CacheInfo(self.block_size, True if self.is_prefix_caching else None),
            info["tokenizer"],
        )  # fmt: skip
        self.stats: list[Any] = [None] * len(self.actors)
        self.restarts = [0] * len(self.actors)
        self._open: dict[str, _Open] = {}
        self._num_pending_adds = 0
        self._is_draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.replicas.info["max_model_len"]

    @property
    def model_name(self) -> str:
        return self.replicas.info["model_name"]

    @property
    def is_draining(self) -> bool:
        return self._is_draining

    @property
    def is_running(self) -> bool:
        return any(not t.done() for t in self._tasks)

    def num_in_flight(self) -> int:
        return len(self._open) + self._num_pending_adds

    def replica_health(self) -> list[dict[str, Any]]:
        return [
            dict(replica=i, status="ok" if v.is_alive else "down", num_open=v.num_open,
                 restarts=self.restarts[i])
            for i, v in enumerate(self.router.views)
        ]  # fmt: skip

    def health(self) -> tuple[int, dict[str, Any]]:
        return health(self.replica_health())

    def metric_collector(self) -> ReplicaCollector:
        return ReplicaCollector(self)

    def get_stats(self) -> Any:
        return sum_stats([s for s in self.stats if s is not None])

    def start(self) -> None:
        """Start one poll loop per replica (idempotent), from inside the event loop."""
        if self.is_running:
            return
        self._loop = asyncio.get_running_loop()
        self._tasks = [self._loop.create_task(self._poll_loop(i)) for i in range(len(self.actors))]

    def begin_drain(self) -> None:
        self._is_draining = True
        for actor in self.actors:
            actor.begin_drain.remote()

    def abort_all(self) -> None:
        """Stop admitting; every replica ends its requests with finish_reason "abort"."""
        self._is_draining = True
        for actor in self.actors:
            actor.abort_all.remote()

    async def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Drain up to `timeout` s, abort, stop the engines (and the actors if `close_replicas`)."""
        self.begin_drain()
        start = time.monotonic()
        while (
            drain
            and self.num_in_flight()
            and (timeout is None or time.monotonic() - start < timeout)
        ):
            await asyncio.sleep(0.02)
        self.abort_all()
        deadline = time.monotonic() + 5.0
        while self._open and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        calls = [a.shutdown.remote(False, 5.0) for a in self.actors]
        await asyncio.wait([asyncio.ensure_future(_quiet(c)) for c in calls], timeout=10.0)
        await self.detach()
        if self.close_replicas:
            self.replicas.close()

    async def detach(self) -> None:
        """Stop this front end only (abort its requests); the replicas go on serving."""
        for request_id, open_ in list(self._open.items()):
            self.abort(request_id)
            open_.queue.put_nowait(EngineDeadError("the server shut down"))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def add_request(
        self, prompt: str | list[int], params: Any, request_id: str | None = None
    ) -> RequestStream:
        """Route and submit a request; returns once a replica admitted it. Raises:
        InvalidRequestError, QueueFullError, EngineDrainingError, EngineDeadError (none serving)."""
        request_id = request_id or uuid.uuid4().hex
        if self._is_draining:
            raise EngineDrainingError("the server is shutting down")
        if request_id in self._open:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
        text = prompt if isinstance(prompt, str) else None
        self.start()
        self._num_pending_adds += 1
        try:
            ids, hashes = await asyncio.to_thread(self._prepare, prompt, params)
            queue = OutputQueue(getattr(params, "output_kind", None) is RequestOutputKind.DELTA)
            await self._submit(request_id, ids, hashes, params, queue, text)
        finally:
            self._num_pending_adds -= 1
        return RequestStream(self, request_id, queue)

    def _prepare(self, prompt: Any, params: Any) -> tuple[list[int], list[int]]:
        ids = prompt_token_ids(prompt, self.tokenizer, self.engine.model_config.vocab_size)
        if isinstance(params, SamplingParams):
            validate_lengths(len(ids), params, self.max_model_len)
        if not self.is_prefix_caching:
            return ids, []
        known = getattr(prompt, "block_hashes", None)  # from the server's tokenizer pool
        if known and getattr(prompt, "block_size", 0) == self.block_size:
            hashes = list(known)
        else:
            hashes = extend_block_hashes([], ids, self.block_size)
        ids.block_size, ids.block_hashes = self.block_size, hashes
        return ids, hashes

    async def _submit(self, request_id: str, ids: list[int], hashes: list[int], params: Any,
                      queue: OutputQueue, text: str | None) -> None:  # fmt: skip
        """A replica that dies before admitting the request is routed around once."""
        for attempt in range(2):
            if request_id in self._open:  # another request took the id while this one tokenized
                raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
            try:
                route = self.router.route(request_id, hashes, len(ids))
            except NoReplicaError as e:
                raise EngineDeadError(str(e)) from None
            self._open[request_id] = _Open(route.replica, queue, text)
            actor = self.actors[route.replica]
            try:
                kind, value = await asyncio.shield(actor.add.remote(request_id, ids, params))
            except asyncio.CancelledError:
                self.abort(request_id)
                raise
            except Exception as e:
                self._close(request_id)
                if not _is_actor_gone(e):  # e.g. arguments Ray could not serialize
                    raise
                self._replica_down(route.replica, e)
                if attempt:
                    raise EngineDeadError(f"replica {route.replica} failed: {e}") from None
                continue
            if kind == "error":
                self._close(request_id)
                raise from_wire(value)
            self.router.admitted(request_id, value)
            return

    async def generate(
        self, prompt: str | list[int], params: Any, request_id: str | None = None
    ) -> AsyncIterator[Any]:
        """Yield a request's outputs; closing the iterator aborts it."""
        stream = await self.add_request(prompt, params, request_id)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    def abort(self, request_id: str) -> None:
        """Cancel a request on its replica (thread-safe; unknown ids are ignored)."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and not _in_loop(loop):
            loop.call_soon_threadsafe(self.abort, request_id)
            return
        open_ = self._close(request_id)
        if open_ is not None:
            self.actors[open_.replica].abort.remote(request_id)

    def _close(self, request_id: str) -> _Open | None:
        self.router.finish(request_id)
        return self._open.pop(request_id, None)

    async def _poll_loop(self, i: int) -> None:
        actor = self.actors[i]
        while True:
            try:
                version = self.router.views[i].cache_version
                report = await actor.poll.remote(version, POLL_TIMEOUT, self._poller_id)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - RayActorError, ActorUnavailableError
                self._replica_down(i, e)
                await self._wait_restart(i)
                continue
            self._apply(i, report)

    def _apply(self, i: int, report: Report) -> None:
        self.stats[i] = report.stats
        self.router.report(i, report.load_tokens, report.admit_seq, report.cache_delta)
        for kind, request_id, payload in report.events:
            open_ = self._open.get(request_id)
            if open_ is None or open_.replica != i:
                continue  # aborted here already
            if kind == "out":
                if open_.text is not None and payload.prompt is None:
                    payload.prompt = open_.text
                open_.queue.put_nowait(payload)
                if payload.finished:
                    self._close(request_id)
            else:
                self._close(request_id)
                open_.queue.put_nowait(DONE if kind == "done" else from_wire(payload))

    def _replica_down(self, i: int, error: BaseException) -> None:
        if not self.router.views[i].is_alive:
            return
        logger.error("replica %d failed (%s); its requests end with an error", i, error)
        self.router.set_alive(i, False)
        self.stats[i] = None
        self._fail_open(i, EngineDeadError(f"replica {i} failed: {type(error).__name__}"))

    def _fail_open(self, replica: int | None, error: Exception) -> None:
        for request_id, open_ in list(self._open.items()):
            if replica is None or open_.replica == replica:
                self._close(request_id)
                open_.queue.put_nowait(error)

    async def _wait_restart(self, i: int) -> None:
        while True:
            await asyncio.sleep(RESTART_POLL)
            try:
                await self.actors[i].ready.remote()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - still restarting, or out of restarts
                continue
            self.restarts[i] += 1
            self.router.set_alive(i, True)
            logger.warning("replica %d is serving again", i)
            return


def sum_stats(stats: list[Any]) -> Any:
    """One `EngineStats` of several: counts summed, the prefix hit rate recomputed."""
    if not stats:
        return None
    values: dict[str, Any] = {}
    for f in dataclasses.fields(stats[0]):
        items = [getattr(s, f.name) for s in stats]
        if isinstance(items[0], bool) or not isinstance(items[0], (int, float, dict)):
            values[f.name] = items[0]
        elif isinstance(items[0], dict):
            values[f.name] = _sum_nested(items)
        else:
            values[f.name] = sum(items)
    queried = values.get("prefix_cache_queried_tokens", 0)
    if "prefix_cache_hit_rate" in values:
        values["prefix_cache_hit_rate"] = (
            values["prefix_cache_hit_tokens"] / queried if queried else 0.0
        )
    return type(stats[0])(**values)


def _sum_nested(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for key, value in d.items():
            if isinstance(value, dict):
                out[key] = _sum_nested([out.get(key, {}), value])
            else:
                out[key] = out.get(key, 0) + value
    return out


def _is_actor_gone(error: BaseException) -> bool:
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(error, (RayActorError, ActorUnavailableError))


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _quiet(ref: Any) -> None:
    try:
        await ref
    except Exception:  # noqa: BLE001 - a replica already gone
        pass
