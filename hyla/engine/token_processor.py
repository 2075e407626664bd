"""The tokens of a processed step: each one resolved, checked for its stops, its request ended
through the core's `finish` when one is reached (EOS, stop ids or strings, length, NaN)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from hyla.cache.manager import CacheManager
from hyla.engine.inflight import LaunchedStep
from hyla.engine.request_table import RequestTable
from hyla.engine.sampler import SamplerOutput
from hyla.engine.state_copies import copy_state_rows
from hyla.request import Request, RequestStatus

logger = logging.getLogger("hyla.engine")


class TokenProcessor:
    """`spec` is the engine's speculative decoder (or None); `state_tensors` its state rows."""

    def __init__(self, requests: RequestTable, cache: CacheManager, spec: Any,
                 state_tensors: list, finish: Callable[..., None]) -> None:  # fmt: skip
        self.requests, self.cache, self.spec = requests, cache, spec
        self.state_tensors, self.finish = state_tensors, finish

    def process(self, step: LaunchedStep) -> None:
        """Read `step`'s tokens and decide every stop of its requests."""
        if step.sample is None:
            return
        sample = step.sample.result()
        now = time.monotonic()
        for i, rid in enumerate(step.sample_ids):
            req = step.requests[rid]
            if not sample.is_finite[i]:
                self.poisoned(req)  # also when it ended meanwhile: its blocks stay cached
                continue
            if req.is_finished:  # ended since the launch: its token is dropped
                continue
            try:
                self._take_tokens(step, i, sample, now)
            except Exception as e:  # noqa: BLE001 - its host work failed: it ends alone
                logger.exception("processing a token of %s failed", rid)
                message = f"engine step failed: {type(e).__name__}: {e}"
                self.finish(rid, RequestStatus.FINISHED_ERROR, message)

    def _take_tokens(self, step: LaunchedStep, i: int, sample: SamplerOutput, now: float) -> None:
        """Row `i`'s token, then a verifying request's accepted drafts and rollback (hyla.spec)."""
        rid, req = step.sample_ids[i], step.requests[step.sample_ids[i]]
        rows = [i] if self.spec is None else self.spec.token_rows(
            step.out, rid, i, sample.token_ids, len(step.sample_ids))  # fmt: skip
        taken = 0
        for j in rows:
            if req.is_finished or not sample.is_finite[j]:
                break
            if j != i:
                req.add_placeholder()
            self._take_token(rid, sample.token_ids[j], sample, j, now)
            taken += 1
        if self.spec is not None:
            copy = lambda copies: copy_state_rows(self.state_tensors, copies)  # noqa: E731
            self.spec.settle(step.out, req, taken, self.cache, copy)

    def _take_token(self, rid: str, token: int, sample: SamplerOutput, i: int, now: float) -> None:
        """Row `i` of `sample` is `rid`'s new token: resolve its placeholder, then its stops."""
        self.requests.take_token(rid, token, sample.logprobs[i], sample.top_logprobs[i], now)
        status, reason = self.requests.stop_of(rid, token)
        if status is not None:
            self.finish(rid, status, reason)

    def poisoned(self, req: Request) -> None:
        """Non-finite logits: end `req` with an error and uncache what it filed past its own
        prefix hit (the NaN may come from any of its steps)."""
        self.cache.uncache(req, req.num_cached_tokens // self.cache.block_size)
        message = "the model produced non-finite logits (NaN or Inf) for this request"
        self.finish(req.request_id, RequestStatus.FINISHED_ERROR, message)
