"""A launched step: its forward and sampler are queued on the device, its tokens not read yet.

Each request it sampled holds a placeholder (`Request.num_placeholders`, a count); the next step
takes those input ids from `sample.tokens` on the device (`device_tokens`), and the engine reads
the values after launching it (`LLMEngine._process`). See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hyla.cache.manager import CacheManager
from hyla.engine.sampler import PendingSample, SamplingRow
from hyla.forward_batch import DeviceTokens
from hyla.request import Request, RequestStatus
from hyla.scheduler import SchedulerOutput


@dataclass
class LaunchedStep:
    """`sample_ids[i]` (a scheduler id) owns row i of `sample`; `requests` holds the step's
    scheduled requests, `rows` the sampled ones' `SamplingRow`s."""

    out: SchedulerOutput
    sample_ids: list[str]
    requests: dict[str, Request]
    rows: list[SamplingRow]
    sample: PendingSample | None
    prompt_logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    logits: Any = None  # [n, V] until a step with constrained rows launches its sampler

    def has_tokens_to_read(self) -> bool:
        """Some request it sampled has not ended."""
        return any(not self.requests[r].is_finished for r in self.sample_ids)

    def device_tokens(
        self, out: SchedulerOutput, requests: dict[str, Request]
    ) -> DeviceTokens | None:
        """The input ids of the next step `out` that are this step's tokens, each a one-token
        decode of its placeholder; None when a scheduled row reads a placeholder in another way
        (a preempted sequence recomputed: the value is needed on the host first)."""
        if self.sample is None:
            return None
        rows = {rid: i for i, rid in enumerate(self.sample_ids)}
        dst: list[int] = []
        src: list[int] = []
        start = 0
        for rid, n in out.num_scheduled_tokens.items():
            req = requests[rid]
            if req.num_placeholders:
                row = rows.get(rid)
                if n != 1 or req.num_computed_tokens != req.num_tokens - 1 or row is None:
                    return None
                dst.append(start)
                src.append(row)
            start += n
        return DeviceTokens(self.sample.tokens, tuple(dst), tuple(src))

    def pending_tokens(self, sample_ids: list[str]) -> list[int]:
        """For a later step's sampled rows: the row of this step holding each one's pending
        token (0 for a row without one: its `SamplingRow.num_pending` is 0, the value unread)."""
        rows = {rid: i for i, rid in enumerate(self.sample_ids)}
        return [rows.get(rid, 0) for rid in sample_ids]

    def save_needs_values(self, cache: CacheManager) -> bool:
        """A running request's next decode ends a checkpoint stride at its placeholder and
        planning that save now would evict a cached checkpoint, maybe for a key that already has
        one (`CacheManager.save_evicts_blindly`): the values must be read first."""
        running = (
            self.requests[r]
            for r in self.sample_ids
            if self.requests[r].status is RequestStatus.RUNNING
        )
        return cache.save_evicts_blindly(running)
