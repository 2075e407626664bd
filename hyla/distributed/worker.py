"""One rank of the TP group: its model shard, caches and ModelRunner. Every rank runs the same
`ModelRunner.execute` over the engine's `StepPlan`, so the collectives line up; input ids not
yet on the host are rank 0's (the vocab-parallel embedding broadcasts them)."""

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

from hyla.cache.mm_spans import spans_in
from hyla.config import EngineConfig, ModelConfig
from hyla.distributed.groups import TPGroup, destroy_tp_group, init_tp_group
from hyla.engine.memory import CachePlan, memory_budget, plan_cache
from hyla.engine.model_runner import ModelRunner, RunnerOutput
from hyla.engine.startup import cpu_threads
from hyla.models.hybrid import HybridModel
from hyla.scheduler import SchedulerOutput

ENGINE_EXIT_GRACE_S = 0.5

logger = logging.getLogger("hyla.distributed")


@dataclass
class RequestPlan:
    """One scheduled request for a rank; zeros in `input_ids` stand for device tokens."""

    num_computed_tokens: int
    input_ids: list[int]
    num_tokens: int
    prompt_token_ids: list[int]
    num_prompt_logprobs: int | None
    block_table: list[int]
    state_slot: int


@dataclass
class StepImages:
    """Rank 0's vision tower output, every rank's `multimodal`. `rows`: (packed row, host [n, D])
    over the placeholders; `step_positions`: when not the context indices (M-RoPE)."""

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
    """Rank 0: step `out`'s image rows and positions; None for a text-only step."""
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
    out: SchedulerOutput
    requests: dict[str, RequestPlan] = field(default_factory=dict)
    prompt_logprob_from: dict[str, int] | None = None
    images: StepImages | None = None


def make_step_plan(
    out: SchedulerOutput, requests: dict[str, Any], cache: Any, plp: dict[str, int] | None
) -> StepPlan:
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
    """`all_token_ids` where only [c, c + q) is ever read."""

    def __init__(self, start: int, ids: list[int]) -> None:
        self.start, self.ids = start, ids

    def __getitem__(self, s: slice) -> list[int]:
        return self.ids[s.start - self.start : s.stop - self.start]


@dataclass(frozen=True)
class _Params:
    prompt_logprobs: int | None


class _PlannedRequest:
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
    """A rank's shard and runner; methods run on every rank in the same order, with collectives."""

    def __init__(self, tp: TPGroup, model: HybridModel, config: EngineConfig) -> None:
        self.tp, self.model, self.config = tp, model, config
        self.device = next(model.parameters()).device
        self.runner: ModelRunner | None = None

    def plan_cache(self, max_model_len: int, max_num_seqs: int) -> CachePlan:
        """The minimum over the ranks of the pools each one's free memory allows."""
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
        shapes = [{k: tuple(t.shape) for k, t in layer.items()} for layer in self.runner.caches]
        return self.tp.gather_objects(shapes)

    def execute(self, plan: StepPlan) -> RunnerOutput:
        requests = {rid: _PlannedRequest(p) for rid, p in plan.requests.items()}
        self.runner.multimodal = plan.images
        return self.runner.execute(
            plan.out, requests, _PlannedCache(plan), plan.prompt_logprob_from, None
        )


def _die_with_parent() -> None:
    """SIGKILL this process when the engine process ends, even by os._exit (Linux)."""
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
    """Ranks 1..N-1: load the shard, run rank 0's broadcast methods until "shutdown"."""
    from hyla.distributed.loader import load_rank_model

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the engine; it ends us
    device = config.device
    if device.startswith("cuda"):
        device = f"cuda:{rank}"
        torch.cuda.set_device(device)
    else:
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
        if _engine_exited():  # a served Ctrl-C exits rank 0 by os._exit
            raise SystemExit(0) from None
        logger.exception("tensor-parallel worker rank %d failed", rank)
        sys.stderr.flush()
        raise SystemExit(1) from None
    destroy_tp_group(tp)


def _engine_exited(grace_s: float = ENGINE_EXIT_GRACE_S) -> bool:
    """Whether rank 0 is gone within `grace_s`: its closed connections show before its exit."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return False
    return bool(multiprocessing.connection.wait([parent.sentinel], timeout=grace_s))
