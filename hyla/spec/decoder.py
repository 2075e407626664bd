"""Speculative decoding around the engine's step: a verify step runs a sequence's last token and
k drafts as one chunk and accepts d_{j+1} iff sample s_j == d_{j+1}, else emits s_j (exact
rejection sampling for n-gram drafts). Rollback: the linear layers write the states after
c+1 .. c+k tokens into k scratch rows; the one at the last accepted token is copied to the slot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hyla.cache.manager import CacheManager
from hyla.cache.spec import bytes_per_state_slot
from hyla.config import ConfigError, EngineConfig, ModelConfig, SpeculativeConfig
from hyla.request import Request, RequestStatus
from hyla.scheduler import SchedulerOutput
from hyla.spec.ngram import propose_ngram


@dataclass
class SpecStats:
    """Since start: verify steps of one sequence (`num_drafts`), tokens drafted and accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


class SpecDecoder:
    """Drafts for the running sequences, plans their per-position states, accepts and rolls back.
    `first_row`: the first state row after the slots and checkpoints (scratch rows follow)."""

    def __init__(self, config: SpeculativeConfig, has_state: bool, first_row: int) -> None:
        self.config = config
        self.has_state = has_state
        self.first_row = first_row
        self.stats = SpecStats()

    @property
    def num_state_rows(self) -> int:
        c = self.config
        return c.disable_by_batch_size * c.num_speculative_tokens if self.has_state else 0

    def is_active(self, num_running: int) -> bool:
        return 0 < num_running <= self.config.disable_by_batch_size

    def needs_drain(self, inflight: Any, num_running: int) -> bool:
        """The in-flight step must be processed before scheduling: its verify rows decide the
        next inputs, or this step drafts (drafts need the last token on the host)."""
        if inflight is None:
            return False
        return bool(inflight.out.spec_token_ids) or self.is_active(num_running)

    def propose(self, running: list[Request]) -> None:
        """Set `spec_token_ids` of every running request (empty when it cannot draft)."""
        active = self.is_active(len(running))
        for req in running:
            req.spec_token_ids = self._drafts(req) if active else []

    def _drafts(self, req: Request) -> list[int]:
        p = req.params
        if (
            req.num_placeholders or req.num_uncomputed_tokens != 1 or req.mm_spans
            or p.structured_outputs is not None or len(req.output_token_ids) < p.min_tokens
            or (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) != (1.0, 0.0, 0.0)
        ):  # fmt: skip
            return []
        c = self.config
        k = min(c.num_speculative_tokens, req.max_output_tokens - req.num_output_tokens - 1)
        return propose_ngram(req.all_token_ids, k, c.prompt_lookup_min, c.prompt_lookup_max)

    def plan_states(self, out: SchedulerOutput, requests: dict[str, Request]) -> None:
        """Add the scratch rows of the states after c+1 .. c+k tokens of each drafting sequence
        to `out.state_boundaries` (sharing a row a prefix-cache save already asks for)."""
        if not self.has_state:
            return
        k_max = self.config.num_speculative_tokens
        for j, (rid, drafts) in enumerate(out.spec_token_ids.items()):
            if j >= self.config.disable_by_batch_size:
                raise RuntimeError(f"spec: {j + 1} drafting sequences, rows for fewer")
            c = requests[rid].num_computed_tokens
            marks = dict(out.state_boundaries.get(rid, ()))
            for i in range(len(drafts)):
                marks.setdefault(c + 1 + i, self.first_row + j * k_max + i)
            out.state_boundaries[rid] = sorted(marks.items())

    def token_rows(
        self, out: SchedulerOutput, rid: str, row: int, tokens: list[int], num_sampled: int
    ) -> list[int]:
        """Sample rows of the tokens `rid` emits: its own, then its verify rows up to the first
        rejected draft; `tokens` of all rows, verify rows after the `num_sampled` ordinary ones."""
        drafts = out.spec_token_ids.get(rid)
        if not drafts:
            return [row]
        base = num_sampled
        for other, d in out.spec_token_ids.items():
            if other == rid:
                break
            base += len(d)
        rows = [row] + [base + i for i in range(len(drafts))]
        num_accepted = 0
        while num_accepted < len(drafts) and tokens[rows[num_accepted]] == drafts[num_accepted]:
            num_accepted += 1
        self.stats.num_drafts += 1
        self.stats.num_draft_tokens += len(drafts)
        self.stats.num_accepted_tokens += num_accepted
        return rows[: num_accepted + 1]

    def settle(
        self,
        out: SchedulerOutput,
        req: Request,
        num_emitted: int,
        cache: CacheManager,
        state_copy: Callable[[list[tuple[int, int]]], None],
    ) -> None:
        """After `req` took `num_emitted` tokens of its verify step: its state, computed count
        and blocks at the last accepted token (`state_copy` copies state rows on the device)."""
        drafts = out.spec_token_ids.get(req.request_id)
        if not drafts or req.status is not RequestStatus.RUNNING:
            return
        accepted = num_emitted - 1
        end = req.num_computed_tokens + accepted  # computed: c + 1 since `Scheduler.update`
        if self.has_state and accepted < len(drafts):
            row = dict(out.state_boundaries[req.request_id])[end]
            state_copy([(row, cache.state_slot(req.request_id))])
        req.num_computed_tokens = end
        cache.trim(req.request_id, req.num_tokens)
        cache.commit(req)


def spec_decoder(config: EngineConfig, plan: Any, distributed: bool) -> SpecDecoder | None:
    """The engine's decoder for `config.speculative_config` (EngineConfig), or None when off.
    Raises ConfigError under tensor parallelism (the runner proxy has no state copies yet)."""
    spec = config.speculative_config
    if spec is None:
        return None
    if distributed:
        raise ConfigError("speculative_config: not supported with tensor_parallel_size > 1 or "
                          "distributed_executor_backend mp yet")  # fmt: skip
    return SpecDecoder(spec, plan.bytes_per_slot > 0, plan.num_slots + plan.num_checkpoints)


def spec_state_bytes(config: EngineConfig, model: ModelConfig) -> int:
    """Bytes of the scratch state rows (`SpecDecoder.num_state_rows`), out of the cache budget."""
    spec = config.speculative_config
    if spec is None:
        return 0
    return spec.disable_by_batch_size * spec.num_speculative_tokens * bytes_per_state_slot(model)


def spec_stats(decoder: SpecDecoder | None) -> dict[str, float]:
    """EngineStats fields (vLLM's spec_decode_* counters, and their ratio)."""
    if decoder is None:
        return {}
    s = decoder.stats
    return dict(
        spec_decode_num_drafts=s.num_drafts,
        spec_decode_num_draft_tokens=s.num_draft_tokens,
        spec_decode_num_accepted_tokens=s.num_accepted_tokens,
        spec_decode_acceptance_rate=s.acceptance_rate,
    )
