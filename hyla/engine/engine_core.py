"""EngineCore: the scheduler and one overlapped step per `step()`, over an executor. A step
schedules step N+1 and launches it on the device, then processes step N's tokens while N+1 runs
(stops, outputs); docs/architecture.md has the picture. `LLMEngine` adds admission on top."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from hyla.config import EngineConfig, ModelConfig
from hyla.distributed.groups import ExecutorError
from hyla.engine.fault_policy import FaultPolicy
from hyla.engine.inflight import LaunchedStep
from hyla.engine.kv_offload import attach_tiers
from hyla.engine.loading import cache_manager
from hyla.engine.local_executor import LocalExecutor
from hyla.engine.model_runner import capture_plan
from hyla.engine.request_table import RequestTable
from hyla.engine.sampler import Sampler, make_generator
from hyla.engine.step_stats import StepStats
from hyla.engine.token_processor import TokenProcessor
from hyla.models.hybrid import HybridModel
from hyla.multimodal.budget import EncoderBudget
from hyla.multimodal.runtime import MultimodalRuntime
from hyla.request import (
    RequestOutput,
    RequestStatus,
)
from hyla.scheduler import Scheduler, SchedulerOutput
from hyla.spec.decoder import spec_decoder, spec_state_bytes

logger = logging.getLogger("hyla.engine")


class EngineCore:
    """The step machinery of `LLMEngine`; `executor`: `LocalExecutor` (None) or the
    tensor-parallel ranks'. `step` and `flush` take the lock; `_finish_group` needs it held."""

    def __init__(
        self,
        model: HybridModel,
        engine_config: EngineConfig,
        multimodal: MultimodalRuntime | None,
        executor: Any,
    ) -> None:
        self.model = model.eval()
        self.executor = executor = executor or LocalExecutor(model)
        self.config = engine_config
        self.model_config: ModelConfig = model.config
        # The one resolved value; everything else (server, runner, requests) reads this one.
        self.max_model_len = engine_config.max_model_len or self.model_config.max_context_len
        self.device = device = next(model.parameters()).device
        sched = engine_config.scheduler
        drafts = spec_state_bytes(engine_config, self.model_config)  # drafts' state rows
        plan = executor.plan_cache(engine_config, self.max_model_len, sched.max_num_seqs, drafts)
        self.cache_plan = plan
        self.cache = cache_manager(plan, engine_config.cache, device)
        self.multimodal = multimodal
        self.max_encoder_tokens = sched.max_num_encoder_input_tokens or sched.max_num_batched_tokens
        budget = None
        if multimodal is not None:
            budget = EncoderBudget(self.max_encoder_tokens, multimodal.cache.__contains__)
            multimodal.max_encoder_tokens = self.max_encoder_tokens
        self.scheduler = Scheduler(sched, self.cache, budget)
        self.spec = spec_decoder(engine_config, plan, executor.is_distributed)  # or None
        capture = capture_plan(engine_config, self.model_config, device)
        spec_rows = 0 if self.spec is None else self.spec.num_state_rows
        self.runner = executor.start_runner(plan, capture, self.max_model_len, spec_rows)
        self.runner.multimodal = multimodal
        attach_tiers(self)  # kv offload: host / disk / remote tiers below the prefix cache
        self.sampler = Sampler(make_generator(engine_config.seed, device))
        self.step_stats = StepStats()
        self.requests = RequestTable()
        self.faults = FaultPolicy(self.scheduler, self.requests)
        self.tokens = TokenProcessor(self.requests, self.cache, self.spec,
                                     self.runner.state_tensors, self._finish)  # fmt: skip
        self._lock = threading.RLock()
        self._inflight: LaunchedStep | None = None  # launched; its tokens not on the host yet
        self.num_device_token_steps = 0  # steps that took input ids from the device

    def _finish_group(self, request_id: str, status: RequestStatus) -> None:
        group = self.requests.groups.get(request_id)
        if group is None:
            return
        for seq in group.sequences:
            self._finish(seq.request.request_id, status)
        self.requests.touch_group(request_id)

    def step(self) -> list[RequestOutput]:
        """Launch step N+1, then process step N's tokens while it runs; the outputs of requests
        that got tokens or ended since the last call (a token's comes out a step later)."""
        with self._lock:
            start = time.monotonic()
            self._before_schedule()
            out = self.faults.schedule()
            if self.spec is not None:
                self.spec.plan_states(out, self.scheduler.requests)
            launched = None if out.is_empty else self._launch(out)
            self._drain()  # the host work of step N while N+1 runs
            self._inflight = None if launched is None else self._after_drain(launched)
            self.scheduler.observe_step(out.total_num_tokens, time.monotonic() - start)
            return self.requests.collect_outputs()

    def _before_schedule(self) -> None:
        self._expire_timeouts()
        self.faults.release_suspect()
        if self._inflight is not None and self._inflight.save_needs_values(self.cache):
            self._drain()
        if self.spec is not None:  # drafts need the last tokens on the host
            if self.spec.needs_drain(self._inflight, self.scheduler.num_running):
                self._drain()
            self.spec.propose(self.scheduler.running)

    def _after_drain(self, step: LaunchedStep) -> LaunchedStep | None:
        """The launched step, sampled (constrained rows) and advanced; None when nothing is left
        to read (it failed, or every sampled request ended meanwhile)."""
        if step.logits is not None and self._sample_constrained(step) is None:
            return None
        try:
            self._advance(step)
        except Exception as e:  # noqa: BLE001 - bookkeeping faults are step faults
            self.faults.step_failed(step.out, e, self._finish)
            return None
        return step if step.has_tokens_to_read() else None

    def flush(self) -> list[RequestOutput]:
        """Read the in-flight step's tokens now (waits for the device); their outputs."""
        with self._lock:
            self._drain()
            return self.requests.collect_outputs()

    def _drain(self) -> None:
        step, self._inflight = self._inflight, None
        if step is not None:
            self.tokens.process(step)

    def _expire_timeouts(self) -> None:
        timeout = self.config.request_timeout
        if timeout is None:
            return
        now = time.monotonic()
        for rid, group in list(self.requests.groups.items()):
            if not group.is_finished and now - group.metrics.arrival_time > timeout:
                self._finish_group(rid, RequestStatus.FINISHED_TIMEOUT)

    def _launch(self, out: SchedulerOutput) -> LaunchedStep | None:
        """Queue `out`'s forward and sampling; None when it failed or all its requests ended."""
        requests, plp = self.requests.scheduled(out)
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
            rows = [self.requests.sampling_row(rid) for rid in result.sample_ids + spec_ids]
            sample = None
            constrained = any(r.grammar is not None for r in rows)
            if rows and not constrained:
                inflight = self._inflight
                pending = inflight and inflight.penalty_tokens(result.sample_ids, rows)
                sample = self.sampler.launch(result.logits, rows, pending)
            path = getattr(self.runner, "last_path", "eager")  # (a TP runner proxy has none)
            self.step_stats.stop(path, time.perf_counter() - t0, begin)
        except ExecutorError:  # a rank died or hung: the engine cannot go on
            raise
        except Exception as e:  # noqa: BLE001 - any failure of a step ends only its requests
            self.faults.step_failed(out, e, self._finish)
            return None
        step = LaunchedStep(out, result.sample_ids, requests, rows, sample)
        step.prompt_logprobs = result.prompt_logprobs
        if constrained:
            step.logits = result.logits
        return step

    def _sample_constrained(self, step: LaunchedStep) -> LaunchedStep | None:
        """Sample a step with constrained rows once the step before it was processed (every
        grammar has accepted the tokens before this row's); None when it failed."""
        logits, step.logits = step.logits, None
        try:
            step.rows = [self.requests.sampling_row(rid) for rid in step.sample_ids]
            grammars = [r.grammar for r in step.rows if r.grammar is not None]
            bitmask = self.inputs.grammars.allocate_bitmask(len(grammars))
            for j, grammar in enumerate(grammars):
                grammar.fill_bitmask(bitmask, j)
            step.sample = self.sampler.launch(logits, step.rows, None, bitmask)
        except ExecutorError:
            raise
        except Exception as e:  # noqa: BLE001 - as in `_launch`
            self.faults.step_failed(step.out, e, self._finish)
            return None
        return step

    def _advance(self, step: LaunchedStep) -> None:
        """A launched step's bookkeeping once the step before it was processed: counters, blocks
        and checkpoints filed, a placeholder per sampled request still running."""
        self.scheduler.update(step.out)
        if self.multimodal is not None:  # images computed whole leave the encoder cache
            self.multimodal.after_step(step.requests.values())
        for rid in step.sample_ids:
            if step.requests[rid].status is RequestStatus.RUNNING:
                step.requests[rid].add_placeholder()
            self.faults.forget_probe(rid)  # through a sampled step: no longer a suspect
        for rid, entries in step.prompt_logprobs.items():
            if rid in self.requests.owner:
                self.requests.owner[rid].prompt_logprobs.extend(entries)

    def _finish(self, rid: str, status: RequestStatus, reason: str | int | None = None) -> None:
        """The one place a sequence ends: release its cache and write its status."""
        seq = self.requests.seqs.get(rid)
        if seq is None or seq.request.is_finished:
            return
        self.scheduler.finish(rid, status)  # None for a held suspect: not in the scheduler
        if self.multimodal is not None:
            self.multimodal.release(rid)
        self.faults.forget(rid)
        seq.request.status = status
        seq.request.stop_reason = reason
        self.requests.touch(rid)
