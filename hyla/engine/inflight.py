"""A launched step whose tokens are not read yet: each sampled request holds a placeholder that
the next step takes from `sample.tokens` on the device; `TokenProcessor.process` reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hyla.cache.manager import CacheManager
from hyla.engine.sampler import PendingSample, SamplingRow
from hyla.forward_batch import DeviceTokens, index_tensor
from hyla.request import Request, RequestStatus
from hyla.scheduler import SchedulerOutput


@dataclass
class LaunchedStep:
    """`sample_ids[i]` owns row i of `sample`; `rows` are the sampled requests' `SamplingRow`s."""

    out: SchedulerOutput
    sample_ids: list[str]
    requests: dict[str, Request]
    rows: list[SamplingRow]
    sample: PendingSample | None
    prompt_logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    logits: Any = None  # [n, V] until a step with constrained rows launches its sampler

    def has_tokens_to_read(self) -> bool:
        return any(not self.requests[r].is_finished for r in self.sample_ids)

    def device_tokens(
        self, out: SchedulerOutput, requests: dict[str, Request]
    ) -> DeviceTokens | None:
        """Next step's input ids that are this step's tokens; None when a row needs the value
        on the host first (not a one-token decode of its placeholder, e.g. a recompute)."""
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

    def penalty_tokens(self, sample_ids: list[str], rows: list[SamplingRow]) -> Any:
        """[n] this step's tokens that later `rows` with penalties must count, or None."""
        if self.sample is None or not any(r.num_pending and r.has_penalties for r in rows):
            return None
        src = self.pending_tokens(sample_ids)
        return self.sample.tokens.index_select(0, index_tensor(src, self.sample.tokens.device))

    def pending_tokens(self, sample_ids: list[str]) -> list[int]:
        """This step's row holding each later row's pending token (0, unread, for none)."""
        rows = {rid: i for i, rid in enumerate(self.sample_ids)}
        return [rows.get(rid, 0) for rid in sample_ids]

    def save_needs_values(self, cache: CacheManager) -> bool:
        """Whether the values must be read first: a save planned at a placeholder would evict
        a cached checkpoint blindly (`CacheManager.save_evicts_blindly`)."""
        running = (
            self.requests[r]
            for r in self.sample_ids
            if self.requests[r].status is RequestStatus.RUNNING
        )
        return cache.save_evicts_blindly(running)
