"""One rank of the tensor-parallel group: its model shard, its caches and its ModelRunner.

Each step the engine sends a `StepPlan` (ints only: the scheduler's decision, each request's
context length and known input ids, block tables, state slots); every rank runs the same
`ModelRunner.execute` over it, so the collectives inside the forward line up. Input ids not yet
on the host (the pipeline's device tokens) are rank 0's: the vocab-parallel embedding
broadcasts them. Only rank 0's sampled rows are used.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from hyla.config import EngineConfig, ModelConfig
from hyla.distributed.groups import TPGroup, destroy_tp_group, init_tp_group
from hyla.engine.memory import CachePlan, memory_budget, plan_cache
from hyla.engine.model_runner import ModelRunner, RunnerOutput
from hyla.engine.startup import cpu_threads
from hyla.models.hybrid import HybridModel
from hyla.multimodal.spans import spans_in
from hyla.scheduler import SchedulerOutput

ENGINE_EXIT_GRACE_S = 0.5  # a failed wait for rank 0: how long to look for its exit

logger = logging.getLogger("hyla.distributed")


@dataclass
class RequestPlan:
    """What a rank needs of one scheduled request: its context length, the input ids known
    on the host (zeros stand for device tokens), its lengths and prompt-logprob needs."""

    num_computed_tokens: int
    input_ids: list[int]
    num_tokens: int
    prompt_token_ids: list[int]
    num_prompt_logprobs: int | None
    block_table: list[int]
    state_slot: int


@dataclass
class StepImages:
    """A step's image inputs as rank 0's vision tower made them (the tower lives on rank 0
    only): `rows` (packed row, embedding rows [n, D] on the host) overwrite the embedded
    placeholders on every rank; `step_positions` are the step's positions when they are not
    the context indices (M-RoPE, shifted rows after an image). Every rank's ModelRunner takes
    it as its `multimodal`, so the (collective) embedding runs on all of them alike."""

    rows: list[tuple[int, torch.Tensor]]
    step_positions: torch.Tensor | None

    def embeddings(self, ids, context_lens, query_lens, input_ids, embed):  # noqa: ANN001, ANN201
        if not self.rows:
            return None
        embeds = embed(input_ids)
        for start, rows in self.rows:
            embeds[start : start + rows.shape[0]] = rows.to(embeds.device, embeds.dtype)
        return embeds

    def positions(self, ids, context_lens, query_lens, flat):  # noqa: ANN001, ANN201
        return flat if self.step_positions is None else self.step_positions.to(flat.device)


def step_images(mm: Any, out: SchedulerOutput, requests: dict[str, Any]) -> StepImages | None:
    """Rank 0: the image rows and positions of step `out` from the engine's multimodal
    runtime (encoding the images it has not cached), or None for a text-only step."""
    ids = list(out.num_scheduled_tokens)
    query_lens = [out.num_scheduled_tokens[r] for r in ids]
    context_lens = [requests[r].num_computed_tokens for r in ids]
    rows, start = [], 0
    for rid, c, q in zip(ids, context_lens, query_lens, strict=True):
        prompt = mm.prompts.get(rid)
        for span in spans_in(prompt.spans, c, c + q) if prompt is not None else ():
            image = mm._rows(rid, prompt, prompt.spans.index(span))
            lo, hi = max(c, span.offset), min(c + q, span.end)
            rows.append((start + lo - c, image[lo - span.offset : hi - span.offset].cpu()))
        start += q
    pairs = zip(context_lens, query_lens, strict=True)
    flat = torch.cat([torch.arange(c, c + q) for c, q in pairs])
    positions = mm.positions(ids, context_lens, query_lens, flat)
    moved = None if positions is flat else positions.cpu()
    return StepImages(rows, moved) if rows or moved is not None else None


@dataclass
class StepPlan:
    """One step as it crosses the process boundary."""

    out: SchedulerOutput
    requests: dict[str, RequestPlan] = field(default_factory=dict)
    prompt_logprob_from: dict[str, int] | None = None
    images: StepImages | None = None


def make_step_plan(
    out: SchedulerOutput, requests: dict[str, Any], cache: Any, plp: dict[str, int] | None
) -> StepPlan:
    """The plan of `out` from the engine's requests and cache manager."""
    plan = StepPlan(out, {}, plp)
    for rid, q in out.num_scheduled_tokens.items():
        req = requests[rid]
        c = req.num_computed_tokens
        known = req.all_token_ids[c : c + q]
        wants = plp is not None and rid in plp
        plan.requests[rid] = RequestPlan(
            c, known + [0] * (q - len(known)), req.num_tokens,
            list(req.prompt_token_ids) if wants else [], req.params.prompt_logprobs if wants
            else None, list(cache.block_table(rid)), cache.state_slot(rid),
        )  # fmt: skip
    return plan


class _Window:
    """`all_token_ids` of a planned request: only [c, c + q) is ever read."""

    def __init__(self, start: int, ids: list[int]) -> None:
        self.start, self.ids = start, ids

    def __getitem__(self, s: slice) -> list[int]:
        return self.ids[s.start - self.start : s.stop - self.start]


@dataclass(frozen=True)
class _Params:
    prompt_logprobs: int | None


class _PlannedRequest:
    """The fields of `Request` that `ModelRunner.execute` reads, from a `RequestPlan`."""

    def __init__(self, p: RequestPlan) -> None:
        self.num_computed_tokens = p.num_computed_tokens
        self.all_token_ids = _Window(p.num_computed_tokens, p.input_ids)
        self.num_tokens = p.num_tokens
        self.prompt_token_ids = p.prompt_token_ids
        self.num_prompt_tokens = len(p.prompt_token_ids)
        self.params = _Params(p.num_prompt_logprobs)


class _PlannedCache:
    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan

    def block_table(self, rid: str) -> list[int]:
        return self.plan.requests[rid].block_table

    def state_slot(self, rid: str) -> int:
        return self.plan.requests[rid].state_slot


class Worker:
    """A rank's model shard and runner. Methods are called on every rank in the same order
    (`Executor.collective_rpc`); each may run collectives."""

    def __init__(self, tp: TPGroup, model: HybridModel, config: EngineConfig) -> None:
        self.tp, self.model, self.config = tp, model, config
        self.device = next(model.parameters()).device
        self.runner: ModelRunner | None = None

    def plan_cache(self, max_model_len: int, max_num_seqs: int) -> CachePlan:
        """This rank's pools from its own free memory, then the minimum over the ranks."""
        cache = self.config.cache
        budget = memory_budget(cache, self.device)
        own = plan_cache(self.model.config, cache, max_model_len, max_num_seqs, budget)
        blocks, slots, checkpoints = self.tp.min_ints(
            [own.num_blocks, own.num_slots, own.num_checkpoints]
        )
        return CachePlan(
            blocks, slots, own.block_size, own.bytes_per_block, own.bytes_per_slot, checkpoints
        )

    def start_runner(
        self, plan: CachePlan, graph_batch_sizes: tuple[int, ...], max_model_len: int
    ) -> ModelRunner:
        if self.device.type == "cuda":
            self.model.stack_projections()
        self.runner = ModelRunner(self.model, plan, graph_batch_sizes, max_model_len)
        return self.runner

    def cache_shapes(self) -> list[list[dict[str, tuple[int, ...]]]] | None:
        """Every rank's cache tensor shapes per layer, in rank order (rank 0 gets them)."""
        shapes = [{k: tuple(t.shape) for k, t in layer.items()} for layer in self.runner.caches]
        return self.tp.gather_objects(shapes)

    def execute(self, plan: StepPlan) -> RunnerOutput:
        """The forward of `plan` on this rank (rank 0 runs it through the engine instead)."""
        requests = {rid: _PlannedRequest(p) for rid, p in plan.requests.items()}
        self.runner.multimodal = plan.images
        return self.runner.execute(
            plan.out, requests, _PlannedCache(plan), plan.prompt_logprob_from, None
        )


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the engine process ends (also by os._exit)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def worker_main(
    rank: int,
    world_size: int,
    init_method: str,
    path: str,
    model_config: ModelConfig,
    config: EngineConfig,
    timeout_s: float,
) -> None:
    """Rank 1..N-1: join the group, load its shard, then run the methods rank 0 broadcasts
    until "shutdown". Any failure exits non-zero (the other ranks' collectives then fail)."""
    from hyla.distributed.loader import load_rank_model

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the engine; it ends us
    device = config.device
    if device.startswith("cuda"):
        device = f"cuda:{rank}"
        torch.cuda.set_device(device)
    else:  # the thread count rank 0 takes (`hyla.engine.startup`): small models, one thread
        chosen = cpu_threads(model_config.hidden_size)
        if chosen is not None and torch.get_num_threads() > chosen:
            torch.set_num_threads(chosen)
    tp = init_tp_group(rank, world_size, init_method, device, timeout_s)
    try:
        model = load_rank_model(path, model_config, tp, config.enable_expert_parallel, device)
        worker = Worker(tp, model, config)
        tp.wait_until_ready()
        while True:
            method, args = tp.broadcast_object()
            if method == "shutdown":
                break
            with torch.inference_mode():
                getattr(worker, method)(*args)
    except Exception:
        if _engine_exited():  # rank 0's process ended (a served Ctrl-C exits by os._exit)
            raise SystemExit(0) from None
        logger.exception("tensor-parallel worker rank %d failed", rank)
        sys.stderr.flush()
        raise SystemExit(1) from None
    destroy_tp_group(tp)


def _engine_exited(grace_s: float = ENGINE_EXIT_GRACE_S) -> bool:
    """Whether the engine process (rank 0) is gone or goes within `grace_s`: its exit closes
    the group's connections, which fails this rank's wait for the next plan a moment before
    the process is seen gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return False
    return bool(multiprocessing.connection.wait([parent.sentinel], timeout=grace_s))
