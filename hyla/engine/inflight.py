"""A step left running on the device while the next one is scheduled (async scheduling).

Its sampled requests hold a placeholder token on the host (`Request.num_placeholders`); the
next step takes those input ids from the device (`device_tokens`), and the engine reads the
values after launching it (`LLMEngine._complete_inflight`). See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyla.cache.manager import CacheManager
from hyla.engine.sampler import PendingSample
from hyla.forward_batch import DeviceTokens
from hyla.request import Request, RequestStatus
from hyla.scheduler import SchedulerOutput


@dataclass
class InflightStep:
    """A launched step whose tokens are still on the device: `rows` maps each request that got
    a placeholder token to its row of `pending` (whose `device_tokens` is set: every row plain
    greedy), `requests` holds those requests."""

    rows: dict[str, int]
    requests: dict[str, Request]
    pending: PendingSample

    def device_tokens(
        self, out: SchedulerOutput, requests: dict[str, Request]
    ) -> DeviceTokens | None:
        """The input ids of the next step `out` that are this step's tokens, each a one-token
        decode of its placeholder; None when a scheduled row reads a placeholder in another way
        (a preempted sequence recomputed: the value is needed on the host first)."""
        assert self.pending.device_tokens is not None
        dst: list[int] = []
        src: list[int] = []
        start = 0
        for rid, n in out.num_scheduled_tokens.items():
            req = requests[rid]
            if req.num_placeholders:
                row = self.rows.get(rid)
                if n != 1 or req.num_computed_tokens != req.num_tokens - 1 or row is None:
                    return None
                dst.append(start)
                src.append(row)
            start += n
        return DeviceTokens(self.pending.device_tokens, tuple(dst), tuple(src))

    def save_needs_values(self, cache: CacheManager) -> bool:
        """A running request's next decode ends a checkpoint stride at its placeholder and
        planning that save now would evict a cached checkpoint, maybe for a key that already has
        one (`CacheManager.save_evicts_blindly`): the values must be read first."""
        running = (r for r in self.requests.values() if r.status is RequestStatus.RUNNING)
        return cache.save_evicts_blindly(running)
