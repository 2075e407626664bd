"""Continuous batching in tokens (plain Python): each step maps request ids to uncomputed-token
counts, mixing prefill chunks and decodes. No block: preempt the lowest-ranked unscheduled
request (recompute), admitting none that step. Prefix caching: admit at the longest cached
prefix; wait for a running request computing ours."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from hyla.cache.manager import CacheManager
from hyla.cache.prefix import PrefixHit
from hyla.config import SchedulerConfig
from hyla.multimodal.budget import EncoderBudget
from hyla.request import Request, RequestStatus

# Shorter steps are mostly fixed cost; PROBE_TOKENS caps prefill before a first measurement.
MIN_MEASURED_TOKENS = 32
PROBE_TOKENS = 128
MIN_PREFILL_TOKENS = 16


@dataclass
class SchedulerOutput:
    """One step's decision. `num_scheduled_tokens` is ordered (running first, then admitted)."""

    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted_ids: list[str] = field(default_factory=list)
    # Prefix caching: restores (row, slot) before the forward, saves (slot, row) after; boundaries:
    # request id -> [(tokens computed, row)] inside its chunk. Drafts count after the real tokens.
    state_restores: list[tuple[int, int]] = field(default_factory=list)
    state_saves: list[tuple[int, int]] = field(default_factory=list)
    state_boundaries: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total_num_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


class Scheduler:
    """Owns the waiting and running queues and their requests' cache grants."""

    def __init__(
        self,
        config: SchedulerConfig,
        cache: CacheManager,
        encoder_budget: EncoderBudget | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.encoder_budget = encoder_budget
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._order: dict[str, tuple[int, int]] = {}
        self._counter = itertools.count()
        self.num_preemptions = 0
        self.seconds_per_token: float | None = None

    def _rank(self, req: Request) -> tuple[int, int]:
        return self._order[req.request_id]

    def _enqueue(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        bisect.insort(self.waiting, req, key=self._rank)

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request_id: {req.request_id!r} is already queued")
        prio = req.priority if self.config.policy == "priority" else 0
        self._order[req.request_id] = (prio, next(self._counter))
        self.requests[req.request_id] = req
        self._enqueue(req)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """Update the per-token cost from a step's wall time (recent-weighted)."""
        if num_tokens < MIN_MEASURED_TOKENS or not seconds > 0:
            return
        rate = seconds / num_tokens
        old = self.seconds_per_token
        self.seconds_per_token = rate if old is None else 0.5 * old + 0.5 * rate

    def _token_budget(self) -> int:
        budget = self.config.max_num_batched_tokens
        limit = self.config.max_step_seconds
        if limit <= 0 or not any(r.num_output_tokens > 0 for r in self.running):
            return budget
        floor = len(self.running) + MIN_PREFILL_TOKENS
        rate = self.seconds_per_token
        timed = PROBE_TOKENS if rate is None else int(limit / rate)
        return min(budget, max(floor, timed))

    def _num_new_tokens(self, req: Request, budget: int) -> int:
        n = min(req.num_uncomputed_tokens, budget)
        limit = self.config.long_prefill_token_threshold
        n = min(n, limit) if limit > 0 else n
        return n if self.encoder_budget is None else self.encoder_budget.fit(req, n)

    def _ask_save(self, owner_id: str, end: int, out: SchedulerOutput) -> None:
        owner = self.requests[owner_id]
        n = out.num_scheduled_tokens.get(owner_id)
        self.cache.want_save(owner, end, None if n is None else owner.num_computed_tokens + n)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.cache.free(req.request_id, keep_hashes=True)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(req)

    def _schedule_running(self, out: SchedulerOutput, budget: int, only: str | None) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            skip = only is not None and req.request_id != only
            if skip or req.num_output_tokens >= req.max_output_tokens:  # last token pending
                i += 1
                continue
            n = self._num_new_tokens(req, budget)
            if n == 0:  # its next image waits for the encoder budget
                i += 1
                continue
            drafts = req.spec_token_ids[: budget - n] if n == req.num_uncomputed_tokens else []
            total = req.num_computed_tokens + n + len(drafts)
            while not self.cache.allocate(req.request_id, total):
                victim = max(self.running[i:], key=self._rank)
                self._preempt(victim)
                out.preempted_ids.append(victim.request_id)
                if victim is req:
                    break
            else:
                out.num_scheduled_tokens[req.request_id] = n + len(drafts)
                if drafts:  # verified in this step; saves only from real tokens (hyla.spec)
                    out.spec_token_ids[req.request_id] = drafts
                self.cache.plan_saves(req, req.num_computed_tokens, total - len(drafts))
                budget -= n + len(drafts)
                i += 1
        return budget

    def _admit_waiting(self, out: SchedulerOutput, budget: int, only: str | None) -> None:
        for req in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if only is not None and req.request_id != only:
                continue
            wants_logprobs = req.params.prompt_logprobs is not None  # needs every prompt row
            hit = self.cache.match(req) if not wants_logprobs else PrefixHit()
            shared = None if wants_logprobs else self.cache.in_flight_boundary(req, hit)
            if shared is not None:  # wait for the running request computing our prefix
                self._ask_save(shared[1], shared[0], out)
                continue
            req.num_computed_tokens = hit.num_tokens
            n = self._num_new_tokens(req, budget)
            if n == 0:  # its next image waits for the encoder budget
                req.num_computed_tokens = 0
                continue
            if not self.cache.allocate(req.request_id, hit.num_tokens + n, hit):
                req.num_computed_tokens = 0
                break
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            if req.num_preemptions == 0:
                req.num_cached_tokens = hit.num_tokens
            self.running.append(req)
            self.cache.start(req, hit)
            self.cache.plan_saves(req, hit.num_tokens, hit.num_tokens + n)
            out.num_scheduled_tokens[req.request_id] = n
            budget -= n

    def schedule(self, only: str | None = None) -> SchedulerOutput:
        """Decide the next step; with `only`, schedule that request alone."""
        self.cache.end_step()
        if self.encoder_budget is not None:
            self.encoder_budget.reset()
        out = SchedulerOutput()
        budget = self._schedule_running(out, self._token_budget(), only)
        if not out.preempted_ids:
            self._admit_waiting(out, budget, only)
        ends = {
            rid: self.requests[rid].num_computed_tokens + n
            for rid, n in out.num_scheduled_tokens.items()
        }
        copies = self.cache.take_state_copies(ends)
        out.state_restores, out.state_saves = copies.restores, copies.saves
        out.state_boundaries = copies.boundaries
        return out

    def update(self, out: SchedulerOutput) -> None:
        """Advance scheduled requests, file their blocks; stops are `LLMEngine._process`'s."""
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # aborted after scheduling
            req.num_computed_tokens += n - len(out.spec_token_ids.get(rid, ()))
            self.cache.commit(req)
        self.cache.end_step()

    def finish(self, request_id: str, status: RequestStatus) -> Request | None:
        """End a request, release its cache. Returns it, or None if unknown or finished."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.cache.free(request_id)
        self._order.pop(request_id, None)
        req.status = status
        return req
