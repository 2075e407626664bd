"""Continuous batching in tokens, not phases (plain Python, no torch).

Each step decides `{request_id: num_tokens}`: how many of each request's uncomputed tokens go
into the next forward. A prompt of 1,000 tokens under a 256-token budget is four chunks; a
decode is 1 token; one step freely mixes both. A request samples a new token only in the step
where its `num_computed_tokens` reaches `num_tokens`.

    running (in admission order)      waiting (FCFS, or by (priority, arrival))
    [r0 r1 r2 ... ]  <- admit head --  [w0 w1 ...]
          `-- preempt tail (recompute) --^

While a request is decoding, a step's token budget is also cut to `max_step_seconds` of the
measured seconds per token (`observe_step`): on the CPU 2,048 prompt tokens are seconds of
work, which every stream would wait for between two tokens.

Admission needs a free state slot and the blocks for its first chunk. When a running request
cannot get a block, the lowest-ranked running request not yet scheduled this step is preempted:
its slot and blocks are released and it waits to recompute prompt + generated tokens (from its
longest cached prefix, else from scratch). No request is admitted in a step that preempted.

Prefix caching (`hyla.cache.prefix`) adds three rules:
- a request is admitted at its longest cached prefix (blocks + state checkpoint at one length);
- the states a chunk passes at the stride boundaries the keep policy wants (and at its last
  block boundary, the request's tail) are saved into checkpoints, never by cutting the chunk:

      computed c          k*s          (k+1)*s   chunk end
      |-------------------|-------------|---------)      saves inside the chunk: written by
                          ^ save        ^ save            the linear layers during the forward

- a waiting request whose prefix a running request is computing right now waits for it (and
  asks it to keep the state at their shared boundary) instead of computing it twice; requests
  sharing a prefix are thus admitted together once it is cached.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from hyla.cache.manager import CacheManager
from hyla.cache.prefix import PrefixHit
from hyla.config import SchedulerConfig
from hyla.multimodal.budget import EncoderBudget
from hyla.request import Request, RequestStatus

# Step time budget (`max_step_seconds`): steps of fewer tokens are not measured (their time is
# mostly fixed cost, not tokens); before a first measurement, a prefill beside decoding
# requests takes at most PROBE_TOKENS; a step keeps room for MIN_PREFILL_TOKENS of prefill.
MIN_MEASURED_TOKENS = 32
PROBE_TOKENS = 128
MIN_PREFILL_TOKENS = 16


@dataclass
class SchedulerOutput:
    """One step's decision. `num_scheduled_tokens` is ordered (running first, then admitted)."""

    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted_ids: list[str] = field(default_factory=list)
    # State-row copies (prefix caching): (checkpoint row, slot) before the forward, restoring a
    # cached prefix's state; (slot, checkpoint row) after it, saving the state at a chunk's end;
    # request id -> [(tokens computed there, checkpoint row)] for states inside its chunk.
    state_restores: list[tuple[int, int]] = field(default_factory=list)
    state_saves: list[tuple[int, int]] = field(default_factory=list)
    state_boundaries: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # Draft tokens verified this step (counted in num_scheduled_tokens, after the real ones).
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total_num_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


class Scheduler:
    """Owns the waiting and running queues and the cache grants of their requests.

    Args:
        config: token and sequence budgets, policy ("fcfs" or "priority": lower value first).
        cache: the block/slot bookkeeping shared with the model runner.
        encoder_budget: images encoded per step (`hyla.multimodal.budget`); None: no images.
    """

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
        self.seconds_per_token: float | None = None  # measured (`observe_step`)

    # -- queues ----------------------------------------------------------------------------------

    def _rank(self, req: Request) -> tuple[int, int]:
        return self._order[req.request_id]

    def _enqueue(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        bisect.insort(self.waiting, req, key=self._rank)

    def add_request(self, req: Request) -> None:
        """Queue a new request. Raises ValueError on a duplicate id."""
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

    # -- scheduling ------------------------------------------------------------------------------

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """A step of `num_tokens` took `seconds` (wall time): the per-token cost the step time
        budget divides, an average weighted towards recent steps (it grows with context)."""
        if num_tokens < MIN_MEASURED_TOKENS or not seconds > 0:
            return
        rate = seconds / num_tokens
        old = self.seconds_per_token
        self.seconds_per_token = rate if old is None else 0.5 * old + 0.5 * rate

    def _token_budget(self) -> int:
        """`max_num_batched_tokens`, cut to `max_step_seconds` worth of tokens while a running
        request is decoding (someone waits for this step's token)."""
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
        """A waiting request wants `owner_id`'s state after `end` tokens kept."""
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
        """Decide the next step under `max_num_batched_tokens` and `max_num_seqs`; with `only`,
        schedule that request alone (the others wait)."""
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

    # -- progress --------------------------------------------------------------------------------

    def update(self, out: SchedulerOutput) -> None:
        """Advance the scheduled requests by their scheduled tokens and file their computed
        blocks. Sampled tokens and the stops they decide are the engine's (`LLMEngine._process`:
        one place for every stop); a request ended since `schedule()` is skipped."""
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # aborted after scheduling
            req.num_computed_tokens += n - len(out.spec_token_ids.get(rid, ()))
            self.cache.commit(req)
        self.cache.end_step()

    def finish(self, request_id: str, status: RequestStatus) -> Request | None:
        """End a request (abort, stop string, timeout ...) and release its cache at once.

        Returns: the request, or None when the id is unknown or already finished.
        """
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
