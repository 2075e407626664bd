"""One engine replica, an `AsyncEngine` run as a Ray actor (the unit Ray places and restarts).
Its long `poll` returns all stream events since the last one in one message, not one per token."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from hyla.replicas.router import CacheDelta
from hyla.replicas.wire import Report, to_wire
from hyla.request import RequestOutputKind

CACHE_REPORT_INTERVAL = 0.1  # seconds; each report diffs the set of cached block hashes


class Replica:
    def __init__(self, index: int, model: str | None, options: dict[str, Any],
                 cpu_cores: tuple[int, ...] | None = None) -> None:  # fmt: skip
        if cpu_cores:
            pin_process(cpu_cores)  # before torch starts its threads
        from hyla.engine.async_engine import AsyncEngine
        from hyla.engine.llm_engine import LLMEngine
        from hyla.engine.startup import apply_cpu_threads

        engine = LLMEngine.from_path(model, **options)
        apply_cpu_threads(engine)
        if cpu_cores:
            import torch

            torch.set_num_threads(len(cpu_cores))
        self.index = index
        self.engine = engine
        self.async_engine = AsyncEngine(engine)
        self._open: dict[str, list] = {}  # request id -> [prompt tokens, generated, is_delta]
        self._events: list[tuple[str, str, Any]] = []
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._admit_seq = 0
        self._sent_version = 0
        self._sent_blocks: set[int] = set()
        self._sent_checkpoints: set[int] = set()
        self._last_cache_report = 0.0
        self._poller: str | None = None  # the client whose polls take the events

    async def ready(self) -> int:
        return os.getpid()

    async def describe(self) -> dict[str, Any]:
        e = self.engine
        prefix = e.cache.prefix
        return dict(
            model_name=e.model_name, max_model_len=e.max_model_len, config=e.config,
            model_config=e.model_config, tokenizer=e.tokenizer, block_size=e.cache.block_size,
            is_prefix_caching=prefix is not None, checkpoint_stride=prefix.stride if prefix else 0,
            is_multimodal=e.multimodal is not None, device=str(e.device), pid=os.getpid(),
        )  # fmt: skip

    async def add(self, request_id: str, prompt: Any, params: Any) -> tuple[str, Any]:
        """("ok", admission number) or ("error", wire error)."""
        self.async_engine.start()
        try:
            stream = await self.async_engine.add_request(prompt, params, request_id)
        except Exception as e:
            return "error", to_wire(e)
        self._admit_seq += 1
        is_delta = getattr(params, "output_kind", None) is RequestOutputKind.DELTA
        self._open[request_id] = [len(prompt), 0, is_delta]
        task = asyncio.get_running_loop().create_task(self._pump(request_id, stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return "ok", self._admit_seq

    async def _pump(self, request_id: str, stream: Any) -> None:
        last = None
        try:
            async for last in stream:
                self._count(request_id, last)
                self._emit(("out", request_id, last))
            if last is None or not last.finished:
                self._emit(("done", request_id, None))
        except Exception as e:
            self._emit(("error", request_id, to_wire(e)))
        finally:
            self._open.pop(request_id, None)

    def _count(self, request_id: str, output: Any) -> None:
        entry = self._open.get(request_id)
        if entry is not None:
            n = sum(len(c.token_ids) for c in output.outputs)
            entry[1] = entry[1] + n if entry[2] else n

    def _emit(self, event: tuple[str, str, Any]) -> None:
        self._events.append(event)
        if self._wake is not None:
            self._wake.set()

    async def abort(self, request_id: str) -> None:
        self.async_engine.abort(request_id)

    async def poll(self, have_version: int, timeout: float, poller: str | None = None) -> Report:
        """Events since the last poll (waiting up to `timeout` s for one), the load, and the prefix
        cache keys' change from `have_version` (a full set if it is not the last one sent)."""
        if self._wake is None:
            self._wake = asyncio.Event()
        if poller is not None:
            self._poller = poller
        if not self._events and have_version:  # a new client's first poll answers at once
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
        await asyncio.sleep(0)  # let the step's other streams put their outputs
        if poller is not None and poller != self._poller:  # a detached client's last long poll
            return Report([], 0, self._admit_seq, self.async_engine.get_stats(), None)
        events, self._events = self._events, []
        self._wake.clear()
        load = sum(entry[0] + entry[1] for entry in self._open.values())
        delta = self._cache_delta(have_version)
        return Report(events, load, self._admit_seq, self.async_engine.get_stats(), delta)

    def _cache_delta(self, have_version: int) -> CacheDelta | None:
        prefix = self.engine.cache.prefix
        now = time.monotonic()
        is_current = have_version == self._sent_version
        if prefix is None or (is_current and now - self._last_cache_report < CACHE_REPORT_INTERVAL):
            return None
        self._last_cache_report = now
        # the engine thread writes these dicts: set() copies them in one pass under the GIL
        blocks = set(prefix.block_pool.cached)
        checkpoints = set(prefix.checkpoints.cached)
        base = self._sent_version if is_current else None
        old_blocks = self._sent_blocks if is_current else set()
        old_checkpoints = self._sent_checkpoints if is_current else set()
        self._sent_version += 1
        delta = CacheDelta(
            self._sent_version, base,
            frozenset(blocks - old_blocks), frozenset(old_blocks - blocks),
            frozenset(checkpoints - old_checkpoints), frozenset(old_checkpoints - checkpoints),
        )  # fmt: skip
        self._sent_blocks, self._sent_checkpoints = blocks, checkpoints
        return delta

    async def get_stats(self) -> Any:
        return self.async_engine.get_stats()

    async def begin_drain(self) -> None:
        self.async_engine.begin_drain()

    async def abort_all(self) -> None:
        self.async_engine.abort_all()

    async def shutdown(self, drain: bool, timeout: float | None) -> None:
        await self.async_engine.shutdown(drain=drain, timeout=timeout)
        self.engine.shutdown()


def pin_process(cores: tuple[int, ...]) -> None:
    """Pin every thread, not just this one: Ray runs the actor's event loop on its own thread."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass
