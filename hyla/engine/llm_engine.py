"""LLMEngine: requests in, one scheduler step + forward + sample per `step()`, outputs out.

    add_request -> Scheduler.waiting
    step():  Scheduler.schedule() -> {seq id: num_tokens}
             ModelRunner.execute()  -> logits of rows that finished their tokens
             Sampler                -> one token per such row
             Scheduler.update()     -> counters, token stops, frees blocks/slots
             detokenize, stop strings -> RequestOutput per touched request

With `async_output` (the default on CUDA) the last line moves: a step launches its forward and
sampler, then detokenizes the previous step's tokens and builds their outputs while the device
runs, then waits for its own tokens and updates the scheduler.

All public methods take one lock, so another thread (the async server loop) may call
`add_request`/`abort_request` while a loop thread calls `step()`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hyla.cache.manager import CacheManager
from hyla.config import ConfigError, EngineConfig, ModelConfig
from hyla.engine.cuda_graphs import graph_batch_sizes, kernels_capturable
from hyla.engine.group import RequestGroup, Sequence, new_group, sequence_id
from hyla.engine.inflight import InflightStep
from hyla.engine.memory import memory_budget, plan_cache
from hyla.engine.model_runner import ModelRunner
from hyla.engine.sampler import PendingSample, Sampler, SamplingRow, make_generator
from hyla.engine.validate import prompt_token_ids, validate_lengths
from hyla.models.hybrid import HybridModel
from hyla.request import (
    PLACEHOLDER_TOKEN,
    InvalidRequestError,
    QueueFullError,
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    SamplingParamsError,
    check_token_stop,
)
from hyla.scheduler import Scheduler, SchedulerOutput

logger = logging.getLogger("hyla.engine")

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "default_model"


@dataclass
class EngineStats:
    """A snapshot of queue and cache occupancy (requests, not sequences, for the queues).

    Prefix-cache counters (since start, over admitted sequences): `prefix_cache_queried_tokens`
    and `prefix_cache_hit_tokens` (tokens served from the cache), their ratio
    `prefix_cache_hit_rate`, and `prefix_cache_block_only_tokens`: tokens whose attention blocks
    were cached up to a checkpoint boundary without the linear-state checkpoint there (a miss
    that an engine restoring the blocks alone would turn into silently wrong output).
    `prefix_cache_below_{block,stride}_queries`: sequences too short to reuse anything (no full
    block before the last token) or to reach a stride checkpoint (only a finished request's tail
    serves them); `cached_checkpoint_bytes` = cached checkpoints x bytes per checkpoint.
    """

    num_running: int
    num_waiting: int
    num_total_blocks: int
    num_free_blocks: int
    num_total_slots: int
    num_free_slots: int
    num_running_seqs: int = 0
    num_waiting_seqs: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    prefix_cache_hit_rate: float = 0.0
    prefix_cache_block_only_tokens: int = 0
    num_cached_blocks: int = 0
    num_total_checkpoints: int = 0
    num_cached_checkpoints: int = 0
    cached_checkpoint_bytes: int = 0
    prefix_cache_below_block_queries: int = 0
    prefix_cache_below_stride_queries: int = 0
    prefix_cache_checkpoint_saves: int = 0


class LLMEngine:
    """Serves many requests at once over one model.

    Args:
        model: a loaded `HybridModel` (eval mode; its device is the engine's device).
        tokenizer: a transformers tokenizer or None (token-id prompts only).
        engine_config: cache, scheduler and engine options.
    Raises:
        ConfigError: the cache budget cannot hold one full-length sequence.
    """

    def __init__(self, model: HybridModel, tokenizer: Any, engine_config: EngineConfig) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = engine_config
        self.model_config: ModelConfig = model.config
        self.model_name = "hyla"
        self.max_model_len = (
            engine_config.max_model_len
            or engine_config.scheduler.max_model_len
            or self.model_config.max_context_len
        )
        device = next(model.parameters()).device
        sched = engine_config.scheduler
        budget = memory_budget(engine_config.cache, device)
        plan = plan_cache(
            self.model_config, engine_config.cache, self.max_model_len, sched.max_num_seqs, budget
        )
        self.cache_plan = plan
        has_state = plan.bytes_per_slot > 0  # linear layers: prefix hits need checkpoints
        self.cache = CacheManager(
            plan.num_blocks,
            plan.num_slots,
            plan.block_size,
            enable_prefix_caching=engine_config.cache.enable_prefix_caching,
            checkpoint_stride=engine_config.cache.state_checkpoint_stride if has_state else 0,
            num_checkpoints=plan.num_checkpoints,
            checkpoint_policy=engine_config.cache.prefix_checkpoint_policy,
        )
        self.scheduler = Scheduler(sched, self.cache)
        sizes: tuple[int, ...] = ()
        if device.type == "cuda" and not engine_config.enforce_eager:
            if kernels_capturable(self.model_config):
                sizes = graph_batch_sizes(self.model_config, sched.max_num_seqs)
            else:
                logger.warning("no CUDA graphs: triton or fla-core is missing")
        if device.type == "cuda":  # one matmul per projection group (one kernel, not n + 1)
            self.model.stack_projections()
        self.runner = ModelRunner(self.model, plan, sizes, self.max_model_len)
        self.sampler = Sampler(make_generator(engine_config.seed, device))
        self.device = device
        self.eos_token_ids = self._eos_token_ids()
        self._groups: dict[str, RequestGroup] = {}
        self._seq_owner: dict[str, RequestGroup] = {}
        self._seq_of: dict[str, Sequence] = {}  # scheduler id -> its sequence
        self._dirty: dict[str, None] = {}
        self._lock = threading.RLock()
        async_output = engine_config.async_output
        self.async_output = device.type == "cuda" if async_output is None else async_output
        async_scheduling = engine_config.async_scheduling
        self.async_scheduling = self.async_output if async_scheduling is None else async_scheduling
        self._deferred: dict[str, int] = {}  # sampled tokens whose output is not built yet
        self._inflight: InflightStep | None = None  # launched; its tokens not on the host yet
        self.num_inflight_steps = 0  # steps left running while the next one was scheduled

    @classmethod
    def from_path(cls, path: str | None = None, **overrides: Any) -> LLMEngine:
        """Load a checkpoint directory (HF family or hyla layout) and its tokenizer.

        `path` None loads the embedded default model (hyla/assets/default_model/). `overrides`
        are EngineConfig/CacheConfig/SchedulerConfig fields by name.
        Raises: ConfigError for an unknown option or a `tokenizer` directory without tokenizer
            files; FileNotFoundError for a missing checkpoint.
        """
        from hyla.engine.llm import load_tokenizer
        from hyla.models.loader import load_model

        config = resolve_device(EngineConfig.from_kwargs(**overrides))
        directory = Path(path) if path is not None else DEFAULT_MODEL_DIR
        if not directory.exists():
            raise FileNotFoundError(f"model: {directory} does not exist")
        tokenizer = load_tokenizer(config.tokenizer or str(directory))
        if config.tokenizer and tokenizer is None:
            raise ConfigError(
                f"tokenizer: no tokenizer.json or tokenizer_config.json in {config.tokenizer}"
            )
        model = load_model(
            str(directory), dtype=_load_dtype(config), device=config.device,
            quantization=config.quantization, kv_cache_dtype=config.cache.kv_cache_dtype,
            mamba_ssm_cache_dtype=config.cache.mamba_ssm_cache_dtype,
        )  # fmt: skip
        engine = cls(model, tokenizer, config)
        engine.model_name = "default" if path is None else directory.name
        return engine

    def _eos_token_ids(self) -> tuple[int, ...]:
        ids = list(self.model_config.eos_token_ids)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int) and eos not in ids:
            ids.append(eos)
        return tuple(ids)

    # -- requests --------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; its outputs come out of later `step()` calls.

        Raises:
            InvalidRequestError: duplicate id, empty/over-long prompt, token id out of range,
                prompt + max_tokens over max_model_len (a raise leaves nothing allocated).
            SamplingParamsError: stop strings without a tokenizer.
            QueueFullError: `max_queue_len` requests are already waiting.
        """
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params", f"expected SamplingParams, got {type(params)}")
        with self._lock:
            if request_id in self._groups:
                raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
            ids = prompt_token_ids(prompt, self.tokenizer, self.model_config.vocab_size)
            validate_lengths(len(ids), params, self.max_model_len)
            if params.stop and self.tokenizer is None:
                raise SamplingParamsError("stop", "stop strings need a tokenizer")
            limit = self.config.max_queue_len
            if limit is not None and self.scheduler.num_waiting >= limit:
                raise QueueFullError(f"max_queue_len: {limit} requests already waiting")
            arrival = time.monotonic() if arrival_time is None else arrival_time
            self._add_group(request_id, prompt, ids, params, priority, arrival)

    def _add_group(
        self,
        request_id: str,
        prompt: str | list[int],
        ids: list[int],
        params: SamplingParams,
        priority: int,
        arrival: float,
    ) -> None:
        requests, generators = [], []
        for k in range(params.num_sequences):
            requests.append(
                Request(
                    sequence_id(request_id, k),
                    ids,
                    params,
                    eos_token_ids=self.eos_token_ids,
                    max_model_len=self.max_model_len,
                    priority=priority,
                    arrival_time=arrival,
                )
            )
            seed = params.seed
            generators.append(None if seed is None else make_generator(seed + k, self.device))
        text = prompt if isinstance(prompt, str) else None
        group = new_group(request_id, text, ids, params, requests, self.tokenizer, generators)
        self._groups[request_id] = group
        for seq in group.sequences:
            self._seq_owner[seq.request.request_id] = group
            self._seq_of[seq.request.request_id] = seq
            self.scheduler.add_request(seq.request)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Finish requests with reason "abort", freeing their blocks and slots now; the final
        output comes out of the next `step()`. Unknown ids are ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        with self._lock:
            for rid in ids:
                self._finish_group(rid, RequestStatus.FINISHED_ABORTED)

    def _finish_group(self, request_id: str, status: RequestStatus) -> None:
        group = self._groups.get(request_id)
        if group is None:
            return
        self._complete_inflight()  # its last token ends it first, as in the synchronous engine
        self._flush_deferred(group)
        for seq in group.sequences:
            if not seq.is_finished:
                self.scheduler.finish(seq.request.request_id, status)
        self._dirty[request_id] = None

    def _flush_deferred(self, group: RequestGroup) -> None:
        """Detokenize `group`'s tokens still waiting for the next step (`async_output`) now:
        a stop string they complete ended the request before an abort or timeout that comes
        after them, as in the synchronous engine."""
        if not self._deferred:
            return
        tokens = {}
        for seq in group.sequences:
            rid = seq.request.request_id
            if rid in self._deferred:
                tokens[rid] = self._deferred.pop(rid)
        self._process_tokens(tokens)

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return bool(self._groups)

    def get_num_unfinished_requests(self) -> int:
        with self._lock:
            return len(self._groups)

    def get_stats(self) -> EngineStats:
        with self._lock:
            running = {self._seq_owner[r.request_id].request_id for r in self.scheduler.running}
            plan = self.cache_plan
            return EngineStats(
                num_running=len(running),
                num_waiting=sum(
                    1
                    for g in self._groups.values()
                    if g.request_id not in running and not g.is_finished
                ),
                num_total_blocks=plan.num_usable_blocks,
                num_free_blocks=self.cache.num_free_blocks,
                num_total_slots=plan.num_usable_slots,
                num_free_slots=self.cache.num_free_slots,
                num_running_seqs=self.scheduler.num_running,
                num_waiting_seqs=self.scheduler.num_waiting,
                num_preemptions=self.scheduler.num_preemptions,
                **self._prefix_stats(),
            )

    def _prefix_stats(self) -> dict[str, Any]:
        prefix = self.cache.prefix
        if prefix is None:
            return {}
        s = prefix.stats
        return dict(
            prefix_cache_queries=s.num_queries,
            prefix_cache_queried_tokens=s.num_queried_tokens,
            prefix_cache_hit_tokens=s.num_hit_tokens,
            prefix_cache_hit_rate=s.hit_rate,
            prefix_cache_block_only_tokens=s.num_block_only_tokens,
            num_cached_blocks=self.cache.block_pool.num_cached_blocks,
            num_total_checkpoints=prefix.checkpoints.num_checkpoints,
            num_cached_checkpoints=len(prefix.checkpoints.cached),
            cached_checkpoint_bytes=len(prefix.checkpoints.cached) * self.cache_plan.bytes_per_slot,
            prefix_cache_below_block_queries=s.num_below_block_queries,
            prefix_cache_below_stride_queries=s.num_below_stride_queries,
            prefix_cache_checkpoint_saves=s.num_checkpoint_saves,
        )

    # -- the step --------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One scheduler step + forward + sample.

        Returns: the outputs of requests that got new tokens or finished (including aborts and
        timeouts since the last step), cumulative. With `async_output` a token's output comes
        out of the step after the one that sampled it: it is built while that next step runs
        on the device (a request stopped by a stop string then computes one token that is
        dropped).
        """
        with self._lock:
            self._expire_timeouts()
            if self._inflight is not None and self._inflight.save_needs_values(self.cache):
                self._complete_inflight()
            out = self.scheduler.schedule()
            if out.is_empty:
                self._complete_inflight()
            outputs = None if out.is_empty else self._run(out)
            if outputs is None:
                outputs = self._deferred_outputs()
            return outputs

    def _expire_timeouts(self) -> None:
        timeout = self.config.request_timeout
        if timeout is None:
            return
        now = time.monotonic()
        for rid, group in list(self._groups.items()):
            if not group.is_finished and now - group.metrics.arrival_time > timeout:
                self._finish_group(rid, RequestStatus.FINISHED_TIMEOUT)

    def _run(self, out: SchedulerOutput) -> list[RequestOutput] | None:
        """Forward and sample `out`; with `async_output`, the previous step's outputs (built
        while this step runs on the device), else None."""
        now = time.monotonic()
        requests: dict[str, Request] = {}
        plp: dict[str, int] = {}
        for rid in out.num_scheduled_tokens:
            group, seq = self._seq_owner[rid], self._seq_of[rid]
            requests[rid] = seq.request
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = now
            pos = group.next_prompt_logprob_position()
            if pos is not None and seq.index == 0:
                plp[rid] = pos
        device_tokens = None
        if self._inflight is not None:
            device_tokens = self._inflight.device_tokens(out, requests)
            if device_tokens is None:  # a row reads an in-flight token otherwise: wait for it
                self._complete_inflight()
                for rid in [r for r in out.num_scheduled_tokens if requests[r].is_finished]:
                    del out.num_scheduled_tokens[rid]  # ended by that token: cache released
                if out.is_empty:
                    return None
        result = self.runner.execute(out, requests, self.cache, plp, device_tokens)
        pending = None
        if result.sample_ids:
            rows = [self._sampling_row(rid) for rid in result.sample_ids]
            pending = self.sampler.launch(result.logits, rows)
        self._complete_inflight()  # the previous step's tokens; the device runs this one
        outputs = self._deferred_outputs() if self.async_output else None
        for rid, entries in result.prompt_logprobs.items():
            self._seq_owner[rid].prompt_logprobs.extend(entries)
        if self.async_scheduling and pending is not None and pending.device_tokens is not None:
            self._launch_inflight(out, result.sample_ids, requests, pending)
            return outputs
        sampled: dict[str, int] = {}
        if pending is not None:
            # Requests stopped by a stop string while this step ran (async_output): their row
            # is dropped unsampled (an unseeded one would draw from the shared generator).
            ended = {
                i
                for i, rid in enumerate(result.sample_ids)
                if requests[rid].status is not RequestStatus.RUNNING
            }
            sample = pending.result(ended)
            for i, rid in enumerate(result.sample_ids):
                if i in ended:
                    continue
                sampled[rid] = sample.token_ids[i]
                self._record_logprobs(rid, sample.logprobs[i], sample.top_logprobs[i])
        self._stamp_token_times(sampled)
        self.scheduler.update(out, sampled)
        if self.async_output:
            self._deferred = sampled
        else:
            self._process_tokens(sampled)
        return outputs

    # -- async scheduling: a step in flight while the next one is scheduled ------------------

    def _launch_inflight(
        self,
        out: SchedulerOutput,
        sample_ids: list[str],
        requests: dict[str, Request],
        pending: PendingSample,
    ) -> None:
        """Leave the step running: each running sampled request gets a placeholder token (so
        the next `schedule()` sees it; a length stop applies now), read in `_complete_inflight`."""
        running = [rid for rid in sample_ids if requests[rid].status is RequestStatus.RUNNING]
        self.scheduler.update(out, dict.fromkeys(running, PLACEHOLDER_TOKEN))
        if not running:  # all ended meanwhile (stop strings, EOS): no token left to read
            return
        rows = {rid: i for i, rid in enumerate(sample_ids)}
        self._inflight = InflightStep(
            {rid: rows[rid] for rid in running}, {rid: requests[rid] for rid in running}, pending
        )
        self.num_inflight_steps += 1

    def _complete_inflight(self) -> None:
        """Wait for the in-flight step's tokens: fill the placeholders, apply the token stops
        the placeholder could not (EOS, stop token ids), record logprobs; the tokens join the
        deferred ones (detokenized by the next `_deferred_outputs`)."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        skip = set(range(len(inflight.pending.rows))) - set(inflight.rows.values())
        sample = inflight.pending.result(skip)
        sampled: dict[str, int] = {}
        for rid, i in inflight.rows.items():
            req = inflight.requests[rid]
            req.fill_placeholder(sample.token_ids[i])
            status = check_token_stop(req)
            if status is not None and not req.is_finished:
                self.scheduler.finish(rid, status)
            elif status is RequestStatus.FINISHED_STOPPED:  # ended by length at the placeholder:
                req.status = status  # EOS wins, as when both are checked on the same token
            sampled[rid] = sample.token_ids[i]
            self._record_logprobs(rid, sample.logprobs[i], sample.top_logprobs[i])
        self._stamp_token_times(sampled)
        self._deferred.update(sampled)

    def _deferred_outputs(self) -> list[RequestOutput]:
        """Detokenize the tokens sampled by the last step (when deferred), then the outputs of
        every request touched since the last collection."""
        deferred, self._deferred = self._deferred, {}
        self._process_tokens(deferred)
        return self._collect_outputs()

    def _sampling_row(self, rid: str) -> SamplingRow:
        seq = self._seq_of[rid]
        if seq.sampling_row is None:  # its lists are the request's own: valid for its lifetime
            req = seq.request
            seq.sampling_row = SamplingRow(
                req.params, req.prompt_token_ids, req.output_token_ids, req.eos_token_ids,
                seq.generator,
            )  # fmt: skip
        return seq.sampling_row

    def _record_logprobs(self, rid: str, logprob: float, top: dict[int, float] | None) -> None:
        seq = self._seq_of[rid]
        seq.cumulative_logprob += logprob
        if seq.logprobs is not None and top is not None:
            seq.logprobs.append(top)

    def _stamp_token_times(self, sampled: dict[str, int]) -> None:
        now = time.monotonic()
        for rid in sampled:
            metrics = self._seq_owner[rid].metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now

    def _process_tokens(self, sampled: dict[str, int]) -> None:
        """Detokenize each sampled token (stop strings finish their request) and mark its
        request's output for collection."""
        for rid, token in sampled.items():
            group, seq = self._seq_owner[rid], self._seq_of[rid]
            req = seq.request
            token_stop = req.status is RequestStatus.FINISHED_STOPPED
            if not token_stop or req.params.include_stop_str_in_output:
                stop = seq.detokenizer.update([token])
                if stop is not None:
                    if not req.is_finished:
                        self.scheduler.finish(rid, RequestStatus.FINISHED_STOPPED)
                    req.status = RequestStatus.FINISHED_STOPPED
                    req.stop_reason = stop
            self._dirty[group.request_id] = None

    def _collect_outputs(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        now = time.monotonic()
        for rid in self._dirty:
            group = self._groups[rid]
            if not group.wants_stream_output():
                continue
            if group.is_finished:
                group.metrics.finished_time = now
                del self._groups[rid]
                for seq in group.sequences:
                    self._seq_owner.pop(seq.request.request_id, None)
                    self._seq_of.pop(seq.request.request_id, None)
            outputs.append(group.output())
        self._dirty.clear()
        return outputs


def resolve_device(config: EngineConfig) -> EngineConfig:
    """`config` with device "auto" replaced by "cuda" when torch sees a GPU, else "cpu"."""
    if config.device != "auto":
        return config
    return dataclasses.replace(config, device="cuda" if torch.cuda.is_available() else "cpu")


def _load_dtype(config: EngineConfig) -> str | None:
    """`--dtype`, else the checkpoint's dtype on a GPU and float32 on the CPU, where bf16
    matmuls are tens of times slower than fp32 on CPUs without native bf16 units."""
    if config.dtype is not None:
        return config.dtype
    return "float32" if str(config.device).startswith("cpu") else None
