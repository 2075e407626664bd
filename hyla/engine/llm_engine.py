"""LLMEngine: requests in, one overlapped step per `step()`, outputs out.

    step():  Scheduler.schedule()        -> {seq id: num_tokens} for step N+1
             launch N+1: ModelRunner.execute + Sampler.launch, queued on the device; input ids
                         of decodes whose token step N sampled come from N's device tokens;
                         Scheduler.update advances counters, each sampled request gets a
                         placeholder (a count, never a value in its token list)
             process N:  read N's tokens; `_process` decides every stop (EOS, stop ids,
                         length, stop strings, non-finite logits; aborts and timeouts come
                         through `_finish_group`); `_finish` releases the cache and writes
                         the status; RequestOutput per touched request

A step with a constrained row (a grammar, `hyla.structured`) launches only its forward before
processing N; its sampler follows once N's tokens have advanced the grammars, with the bitmask
of every constrained row (`_sample_constrained`): the forward of N+1 still overlaps the host work
of N, and steps without a constrained row keep the order above.

On the CPU the device finishes each launch before the host goes on, so the same code runs the
steps one after the other; on a GPU the host work of step N hides behind step N+1.

All public methods take one lock, so another thread (the async server loop) may call
`add_request`/`abort_request` while a loop thread calls `step()`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import torch

from hyla.cache.manager import CacheManager
from hyla.config import EngineConfig, ModelConfig
from hyla.distributed.groups import ExecutorError
from hyla.engine.group import RequestGroup
from hyla.engine.inflight import LaunchedStep
from hyla.engine.input_processor import InputProcessor
from hyla.engine.kv_offload import attach_tiers
from hyla.engine.loading import checkpoint_policy
from hyla.engine.memory import memory_budget, plan_cache
from hyla.engine.model_runner import ModelRunner, capture_plan
from hyla.engine.request_table import RequestTable
from hyla.engine.sampler import Sampler, SamplerOutput, SamplingRow, make_generator
from hyla.engine.state_copies import copy_state_rows
from hyla.engine.stats import EngineStats, engine_stats
from hyla.engine.step_stats import StepStats
from hyla.forward_batch import index_tensor
from hyla.models.hybrid import HybridModel
from hyla.multimodal.budget import EncoderBudget
from hyla.multimodal.runtime import MultimodalRuntime, PreparedPrompt
from hyla.request import (
    InvalidRequestError,
    QueueFullError,
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
)
from hyla.scheduler import Scheduler, SchedulerOutput
from hyla.spec.decoder import spec_decoder, spec_state_bytes

logger = logging.getLogger("hyla.engine")


class LLMEngine:
    """Serves many requests at once over one model.

    Args:
        model: a loaded `HybridModel` (eval mode; its device is the engine's device).
        tokenizer: a transformers tokenizer or None (token-id prompts only).
        engine_config: cache, scheduler and engine options.
        multimodal: the vision side of a multimodal checkpoint (None: text only).
        executor: runs the model on the tensor-parallel ranks (`hyla.distributed`; `model` is
            rank 0's shard); None: in this process, as it is.
    Raises:
        ConfigError: the cache budget cannot hold one full-length sequence.
    """

    def __init__(
        self,
        model: HybridModel,
        tokenizer: Any,
        engine_config: EngineConfig,
        multimodal: MultimodalRuntime | None = None,
        executor: Any = None,
    ) -> None:
        self.model = model.eval()
        self.executor = executor
        self.tokenizer = tokenizer
        self.config = engine_config
        self.model_config: ModelConfig = model.config
        self.model_name = "hyla"
        # The one resolved value; everything else (server, runner, requests) reads this one.
        self.max_model_len = engine_config.max_model_len or self.model_config.max_context_len
        device = next(model.parameters()).device
        sched = engine_config.scheduler
        if executor is None:
            budget = memory_budget(engine_config.cache, device)
            budget -= spec_state_bytes(engine_config, self.model_config)  # drafts' state rows
            plan = plan_cache(
                self.model_config, engine_config.cache, self.max_model_len, sched.max_num_seqs,
                budget,
            )  # fmt: skip
        else:  # each rank's own pools, then the minimum over the ranks
            plan = executor.collective_rpc("plan_cache", self.max_model_len, sched.max_num_seqs)
        self.cache_plan = plan
        has_state = plan.bytes_per_slot > 0  # linear layers: prefix hits need checkpoints
        self.cache = CacheManager(
            plan.num_blocks,
            plan.num_slots,
            plan.block_size,
            enable_prefix_caching=engine_config.cache.enable_prefix_caching,
            checkpoint_stride=engine_config.cache.state_checkpoint_stride if has_state else 0,
            num_checkpoints=plan.num_checkpoints,
            checkpoint_policy=checkpoint_policy(engine_config.cache, device),
        )
        self.multimodal = multimodal
        self.max_encoder_tokens = sched.max_num_encoder_input_tokens or sched.max_num_batched_tokens
        budget = None
        if multimodal is not None:
            budget = EncoderBudget(self.max_encoder_tokens, multimodal.cache.__contains__)
            multimodal.max_encoder_tokens = self.max_encoder_tokens
        self.scheduler = Scheduler(sched, self.cache, budget)
        self.spec = spec_decoder(engine_config, plan, executor)  # speculative decoding or None
        sizes, buckets, mixed = capture_plan(engine_config, self.model_config, device)
        if executor is not None:
            from hyla.distributed.executor import start_runner

            self.runner = start_runner(executor, plan, sizes, self.max_model_len)
        else:
            if device.type == "cuda":  # one matmul per projection group (one kernel, not n + 1)
                self.model.stack_projections()
            self.runner = ModelRunner(
                self.model, plan, sizes, self.max_model_len, buckets, mixed,
                num_spec_rows=0 if self.spec is None else self.spec.num_state_rows,
            )  # fmt: skip
        self.runner.multimodal = multimodal
        attach_tiers(self)  # kv offload: host / disk / remote tiers below the prefix cache
        self.sampler = Sampler(make_generator(engine_config.seed, device))
        self.device = device
        self.step_stats = StepStats()
        self.inputs = InputProcessor(self.model_config, tokenizer, multimodal, self.max_model_len,
                                     device)  # fmt: skip
        self.requests = RequestTable()
        self._lock = threading.RLock()
        self._inflight: LaunchedStep | None = None  # launched; its tokens not on the host yet
        self.num_device_token_steps = 0  # steps that took input ids from the device
        self._suspects: dict[str, None] = {}  # held out after a failed step (`_step_failed`)
        self._probe: str | None = None  # the suspect back in the scheduler, on probation

    @classmethod
    def from_path(cls, path: str | None = None, **overrides: Any) -> LLMEngine:
        """`hyla.engine.loading.load_engine`: a checkpoint directory (None: the embedded default
        model) and its tokenizer, warmed up; `overrides` are config fields by name."""
        from hyla.engine.loading import load_engine

        return load_engine(cls, path, **overrides)

    @property
    def prefix_block_size(self) -> int | None:
        """The cache's block size when prefix caching is on (prompt block hashes use it)."""
        return self.cache.block_size if self.cache.prefix is not None else None

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (the engine cannot step afterwards)."""
        if self.executor is not None:
            self.executor.shutdown()

    # -- requests --------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | PreparedPrompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        multi_modal_data: dict[str, Any] | None = None,
    ) -> None:
        """Queue a request; its outputs come out of later `step()` calls. `multi_modal_data`
        {"image": PIL image or list}: the prompt holds one image token per image
        (`hyla.multimodal.inputs`); a `PreparedPrompt` carries its images processed.

        Raises:
            InvalidRequestError: duplicate id, empty/over-long prompt, token id out of range,
                prompt + max_tokens over max_model_len (a raise leaves nothing allocated), a
                bad image or an image for a text-only model (`multi_modal_data.image`).
            SamplingParamsError: stop strings without a tokenizer.
            QueueFullError: `max_queue_len` requests are already waiting.
        """
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params", f"expected SamplingParams, got {type(params)}")
        with self._lock:
            if request_id in self.requests.groups:
                raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
            ids, mm = self.inputs.prompt(prompt, params, multi_modal_data)
            limit = self.config.max_queue_len
            if limit is not None and self.scheduler.num_waiting >= limit:
                raise QueueFullError(limit)
            arrival = time.monotonic() if arrival_time is None else arrival_time
            group = self.inputs.group(request_id, prompt, ids, params, priority, arrival, mm)
            self._register(group, ids, mm)

    def _register(self, group: RequestGroup, ids: list[int], mm: Any) -> None:
        self.requests.add(group)
        hashes = getattr(ids, "block_hashes", None)  # computed off this thread (TokenIds)
        if hashes and mm is None and getattr(ids, "block_size", 0) == self.cache.block_size:
            for seq in group.sequences:
                self.cache.seed_hashes(seq.request.request_id, ids, hashes)
        for seq in group.sequences:
            self.scheduler.add_request(seq.request)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Finish requests with reason "abort", freeing their blocks and slots now (tokens still
        on the device are dropped); the final output comes out of the next `step()`. Unknown
        ids are ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        with self._lock:
            for rid in ids:
                self._finish_group(rid, RequestStatus.FINISHED_ABORTED)

    def _finish_group(self, request_id: str, status: RequestStatus) -> None:
        group = self.requests.groups.get(request_id)
        if group is None:
            return
        for seq in group.sequences:
            self._finish(seq.request.request_id, status)
        self.requests.touch_group(request_id)

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return bool(self.requests.groups)

    def get_num_unfinished_requests(self) -> int:
        with self._lock:
            return len(self.requests.groups)

    def get_stats(self) -> EngineStats:
        with self._lock:
            return engine_stats(self)

    # -- the step --------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One pipelined step: schedule step N+1 and launch it on the device, then process step
        N's tokens on the host while it runs (stops, detokenization, outputs).

        Returns: the outputs of requests that got new tokens or finished since the last call
        (aborts, timeouts and errors included), cumulative or deltas as each request's
        `SamplingParams.output_kind` asks. A token's output comes out of the
        step after the one that sampled it; a request ended by a token (EOS, stop string) has
        one more token computed meanwhile, which is dropped.
        """
        with self._lock:
            start = time.monotonic()
            self._expire_timeouts()
            self._release_suspect()
            if self._inflight is not None and self._inflight.save_needs_values(self.cache):
                self._drain()
            if self.spec is not None:  # drafts need the last tokens on the host
                if self.spec.needs_drain(self._inflight, self.scheduler.num_running):
                    self._drain()
                self.spec.propose(self.scheduler.running)
            out = self._schedule()
            if self.spec is not None:
                self.spec.plan_states(out, self.scheduler.requests)
            launched = None if out.is_empty else self._launch(out)
            self._drain()  # the host work of step N while N+1 runs
            if launched is not None and launched.logits is not None:
                launched = self._sample_constrained(launched)
            if launched is not None and not self._advance_or_fail(launched):
                launched = None
            if launched is not None:
                if not launched.has_tokens_to_read():
                    launched = None  # every sampled request ended meanwhile: nothing to read
            self._inflight = launched
            self.scheduler.observe_step(out.total_num_tokens, time.monotonic() - start)
            return self.requests.collect_outputs()

    def _schedule(self) -> SchedulerOutput:
        """The next step; a suspect on probation runs alone, unless it cannot run alone (no cache
        for it while the others hold theirs, or it waits for another's prefix)."""
        out = self.scheduler.schedule(only=self._probe)
        if out.is_empty and self._probe is not None:
            out = self.scheduler.schedule()
        return out

    def flush(self) -> list[RequestOutput]:
        """Read the in-flight step's tokens now (waits for the device); their outputs."""
        with self._lock:
            self._drain()
            return self.requests.collect_outputs()

    def _drain(self) -> None:
        """Process the in-flight step now (waits for its tokens)."""
        step, self._inflight = self._inflight, None
        if step is not None:
            self._process(step)

    def _expire_timeouts(self) -> None:
        timeout = self.config.request_timeout
        if timeout is None:
            return
        now = time.monotonic()
        for rid, group in list(self.requests.groups.items()):
            if not group.is_finished and now - group.metrics.arrival_time > timeout:
                self._finish_group(rid, RequestStatus.FINISHED_TIMEOUT)

    def _launch(self, out: SchedulerOutput) -> LaunchedStep | None:
        """Queue `out`'s forward and sampling on the device. None when nothing was launched
        (the step failed, or every request in it ended while waiting for the step before)."""
        requests, plp = self._scheduled(out)
        device_tokens = None
        if self._inflight is not None:
            device_tokens = self._inflight.device_tokens(out, requests)
            if device_tokens is None:  # a row reads an in-flight token otherwise: wait for it
                self._drain()
                for rid in [r for r in out.num_scheduled_tokens if requests[r].is_finished]:
                    del out.num_scheduled_tokens[rid]  # ended by that token: cache released
                if out.is_empty:
                    return None
        if device_tokens is not None and device_tokens.dst:
            self.num_device_token_steps += 1
        try:
            t0, begin = time.perf_counter(), self.step_stats.start(self.device)
            result = self.runner.execute(out, requests, self.cache, plp, device_tokens)
            spec_ids = [r for r, d in out.spec_token_ids.items() for _ in d]  # draft rows
            rows = [self._sampling_row(rid) for rid in result.sample_ids + spec_ids]
            sample = None
            constrained = any(r.grammar is not None for r in rows)
            if rows and not constrained:
                pending = self._pending_tokens(result.sample_ids, rows)
                sample = self.sampler.launch(result.logits, rows, pending)
            path = getattr(self.runner, "last_path", "eager")  # (a TP runner proxy has none)
            self.step_stats.stop(path, time.perf_counter() - t0, begin)
        except ExecutorError:  # a rank died or hung: the engine cannot go on
            raise
        except Exception as e:  # noqa: BLE001 - any failure of a step ends only its requests
            self._step_failed(out, e)
            return None
        step = LaunchedStep(out, result.sample_ids, requests, rows, sample)
        step.prompt_logprobs = result.prompt_logprobs
        if constrained:
            step.logits = result.logits
        return step

    def _sample_constrained(self, step: LaunchedStep) -> LaunchedStep | None:
        """Launch the sampler of a step with constrained rows, after the step before it was
        processed: every grammar has accepted every token before this row's. None when it
        failed (as a failed launch)."""
        logits, step.logits = step.logits, None
        try:
            step.rows = [self._sampling_row(rid) for rid in step.sample_ids]
            grammars = [r.grammar for r in step.rows if r.grammar is not None]
            bitmask = self.inputs.grammars.allocate_bitmask(len(grammars))
            for j, grammar in enumerate(grammars):
                grammar.fill_bitmask(bitmask, j)
            step.sample = self.sampler.launch(logits, step.rows, None, bitmask)
        except ExecutorError:
            raise
        except Exception as e:  # noqa: BLE001 - as in `_launch`
            self._step_failed(step.out, e)
            return None
        return step

    def _advance_or_fail(self, step: LaunchedStep) -> bool:
        """`_advance`, with a fault in it (the scheduler's or the cache's bookkeeping) isolated
        as a step fault: its requests are held or failed (`_step_failed`), the rest run on.
        Returns: whether the step is still to be read."""
        try:
            self._advance(step)
        except Exception as e:  # noqa: BLE001 - as in `_launch`
            self._step_failed(step.out, e)
            return False
        return True

    def _advance(self, step: LaunchedStep) -> None:
        """The bookkeeping of a launched step, once the step before it was processed (so every
        computed token but the new placeholders is known): counters, blocks and checkpoints
        filed, a placeholder per sampled request still running."""
        self.scheduler.update(step.out)
        if self.multimodal is not None:  # images computed whole leave the encoder cache
            self.multimodal.after_step(step.requests.values())
        for rid in step.sample_ids:
            if step.requests[rid].status is RequestStatus.RUNNING:
                step.requests[rid].add_placeholder()
            if rid == self._probe:  # through a sampled step: no longer a suspect
                self._probe = None
        for rid, entries in step.prompt_logprobs.items():
            if rid in self.requests.owner:
                self.requests.owner[rid].prompt_logprobs.extend(entries)

    def _scheduled(self, out: SchedulerOutput) -> tuple[dict[str, Request], dict[str, int]]:
        now = time.monotonic()
        requests: dict[str, Request] = {}
        plp: dict[str, int] = {}
        for rid in out.num_scheduled_tokens:
            group, seq = self.requests.owner[rid], self.requests.seqs[rid]
            requests[rid] = seq.request
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = now
            pos = group.next_prompt_logprob_position()
            if pos is not None and seq.index == 0:
                plp[rid] = pos
        return requests, plp

    def _pending_tokens(
        self, sample_ids: list[str], rows: list[SamplingRow]
    ) -> torch.Tensor | None:
        """[n] the in-flight tokens of the rows whose penalties must count them, or None."""
        inflight = self._inflight
        if inflight is None or inflight.sample is None:
            return None
        if not any(r.num_pending and r.has_penalties for r in rows):
            return None
        src = inflight.pending_tokens(sample_ids)
        return inflight.sample.tokens.index_select(0, index_tensor(src, self.device))

    def _step_failed(self, out: SchedulerOutput, error: Exception) -> None:
        """A step raised. Requests outside it keep running. The culprit, when known (alone in
        the step), ends with an error; the step's other
        requests are held out of the scheduler (their cache released: the failed forward may
        have half-updated their state, so they recompute) and come back one at a time
        (`_release_suspect`), each alone in its steps (`Scheduler.schedule(only=...)`: a
        neighbour would make the blame a guess) until it gets through a sampled step."""
        ids = list(out.num_scheduled_tokens)
        logger.exception("engine step failed (%d requests)", len(ids))
        message = f"engine step failed: {type(error).__name__}: {error}"
        culprit = ids[0] if len(ids) == 1 else None
        for rid in ids:
            if rid == culprit:
                self._finish(rid, RequestStatus.FINISHED_ERROR, message)
            else:
                self._hold(rid)

    def _hold(self, rid: str) -> None:
        req = self.requests.seqs[rid].request
        self.scheduler.finish(rid, RequestStatus.FINISHED_ABORTED)  # releases its cache
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        self._suspects[rid] = None
        if self._probe == rid:
            self._probe = None

    def _release_suspect(self) -> None:
        """Put the next held request back into the scheduler, on probation."""
        if self._probe is not None or not self._suspects:
            return
        rid = next(iter(self._suspects))
        del self._suspects[rid]
        self.scheduler.add_request(self.requests.seqs[rid].request)
        self._probe = rid

    def _process(self, step: LaunchedStep) -> None:
        """Read `step`'s tokens and decide every stop of its requests."""
        if step.sample is None:
            return
        sample = step.sample.result()
        now = time.monotonic()
        for i, rid in enumerate(step.sample_ids):
            req = step.requests[rid]
            if not sample.is_finite[i]:
                self._poisoned(req)  # also when it ended meanwhile: its blocks stay cached
                continue
            if req.is_finished:  # ended since the launch: its token is dropped
                continue
            try:
                self._take_tokens(step, i, sample, now)
            except Exception as e:  # noqa: BLE001 - its host work failed: it ends alone
                logger.exception("processing a token of %s failed", rid)
                message = f"engine step failed: {type(e).__name__}: {e}"
                self._finish(rid, RequestStatus.FINISHED_ERROR, message)

    def _take_tokens(self, step: LaunchedStep, i: int, sample: SamplerOutput, now: float) -> None:
        """Row `i`'s token; after it a verifying request's accepted drafts and the token that
        follows them, then its rollback to the last accepted token (`hyla.spec`)."""
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
            copy = lambda copies: copy_state_rows(self.runner.state_tensors, copies)  # noqa: E731
            self.spec.settle(step.out, req, taken, self.cache, copy)

    def _take_token(self, rid: str, token: int, sample: SamplerOutput, i: int, now: float) -> None:
        """Row `i` of `sample` is `rid`'s new token: resolve its placeholder, then its stops."""
        self.requests.take_token(rid, token, sample.logprobs[i], sample.top_logprobs[i], now)
        status, reason = self.requests.stop_of(rid, token)
        if status is not None:
            self._finish(rid, status, reason)

    def _poisoned(self, req: Request) -> None:
        """`req`'s logits were not finite: end it with an error, and make the blocks and
        checkpoints it filed (past its own prefix-cache hit) unfindable, since the NaN may have
        come from any of its steps."""
        self.cache.uncache(req, req.num_cached_tokens // self.cache_plan.block_size)
        message = "the model produced non-finite logits (NaN or Inf) for this request"
        self._finish(req.request_id, RequestStatus.FINISHED_ERROR, message)

    def _finish(self, rid: str, status: RequestStatus, reason: str | int | None = None) -> None:
        """The one place a sequence ends: release its cache and write its status."""
        seq = self.requests.seqs.get(rid)
        if seq is None or seq.request.is_finished:
            return
        self.scheduler.finish(rid, status)  # None for a held suspect: not in the scheduler
        if self.multimodal is not None:
            self.multimodal.release(rid)
        self._suspects.pop(rid, None)
        if self._probe == rid:
            self._probe = None
        seq.request.status = status
        seq.request.stop_reason = reason
        self.requests.touch(rid)

    def _sampling_row(self, rid: str) -> SamplingRow:
        seq = self.requests.seqs[rid]
        req = seq.request
        if seq.sampling_row is None:  # its lists are the request's own: valid for its lifetime
            seq.sampling_row = SamplingRow(
                req.params, req.prompt_token_ids, req.output_token_ids, req.eos_token_ids,
                seq.generator, grammar=seq.grammar,
            )  # fmt: skip
        seq.sampling_row.num_pending = req.num_placeholders
        return seq.sampling_row
