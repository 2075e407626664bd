"""The one place where scheduler output meets tensors: one packed varlen forward per step,
logits only for the rows that need them (row p predicts token p + 1):

    rows:  | r0 chunk (c0..c0+q0) | r1 decode | r2 last prompt chunk |
    logits:  prompt-logprob rows    ^ sample     ^ sample (last row)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from hyla.cache.manager import CacheManager
from hyla.engine.cuda_graphs import (
    CaptureFailed,
    DecodeGraphs,
    DecodeInputs,
    graph_batch_sizes,
    kernels_capturable,
)
from hyla.engine.memory import CachePlan
from hyla.engine.mixed_graphs import MixedGraphs, MixedInputs, mixed_graph_buckets
from hyla.engine.piecewise_graphs import PiecewiseGraphs, token_buckets
from hyla.engine.sampler import top_logprobs
from hyla.engine.state_copies import copy_state_rows, set_state_boundaries, state_tensors
from hyla.forward_batch import (
    DeviceTokens,
    ForwardBatch,
    allocate_caches,
    build_forward_batch,
    index_tensor,
)
from hyla.models.hybrid import HybridModel
from hyla.multimodal.runtime import MultimodalRuntime
from hyla.request import Request
from hyla.scheduler import SchedulerOutput

logger = logging.getLogger("hyla.engine")

def capture_plan(config: Any, model_config: Any, device: torch.device) -> tuple[tuple, ...]:
    """(decode batch sizes, piecewise token buckets, mixed-step token buckets) to capture."""
    if device.type != "cuda" or config.enforce_eager:
        return (), (), ()
    if not kernels_capturable(model_config):
        logger.warning("no CUDA graphs: triton or fla-core is missing")
        return (), (), ()
    sched = config.scheduler
    sizes = graph_batch_sizes(model_config, sched.max_num_seqs)
    buckets = token_buckets(sched.max_num_batched_tokens) if config.piecewise_cuda_graphs else ()
    mixed = (
        mixed_graph_buckets(model_config, sched.max_num_batched_tokens)
        if config.mixed_cuda_graphs else ()
    )  # fmt: skip
    return sizes, buckets, mixed

@dataclass
class RunnerOutput:
    """`sample_ids[i]` owns row i of `logits: [n + m, V]` float32; the m draft rows follow."""

    sample_ids: list[str] = field(default_factory=list)
    logits: torch.Tensor | None = None
    prompt_logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)


class ModelRunner:
    """Owns the model and its cache tensors (allocated from `plan`); the graph sizes and
    buckets apply on CUDA only (`capture_plan`)."""

    def __init__(
        self,
        model: HybridModel,
        plan: CachePlan,
        graph_batch_sizes: tuple[int, ...] = (),
        max_model_len: int | None = None,
        token_buckets: tuple[int, ...] = (),
        mixed_buckets: tuple[int, ...] = (),
        num_spec_rows: int = 0,
    ) -> None:
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        self.block_size = plan.block_size
        # State rows: slots, then checkpoints, then speculative decoding's scratch rows.
        num_state_rows = plan.num_slots + plan.num_checkpoints + num_spec_rows
        self.caches = allocate_caches(
            self.config, plan.num_blocks, plan.block_size, num_state_rows, self.device
        )
        self.state_tensors = state_tensors(self.config, self.caches)
        self.graphs: DecodeGraphs | None = None
        self.multimodal: MultimodalRuntime | None = None
        if graph_batch_sizes and self.device.type == "cuda":
            self.graphs = DecodeGraphs(
                model, self.caches, self.block_size, graph_batch_sizes,
                max_model_len=max_model_len,
            )  # fmt: skip
        self.mixed: MixedGraphs | None = None
        if mixed_buckets and self.device.type == "cuda":
            self.mixed = MixedGraphs(
                model, self.caches, self.block_size, mixed_buckets, max_model_len
            )
        self.last_path = "eager"  # `hyla.engine.step_stats.PATHS`
        self.piecewise: PiecewiseGraphs | None = None
        if token_buckets and self.device.type == "cuda":
            self.piecewise = PiecewiseGraphs(model, token_buckets)

    @torch.inference_mode()
    def execute(
        self,
        out: SchedulerOutput,
        requests: dict[str, Request],
        cache: CacheManager,
        prompt_logprob_from: dict[str, int] | None = None,
        device_tokens: DeviceTokens | None = None,
    ) -> RunnerOutput:
        """Run one packed forward over `out.num_scheduled_tokens`. `prompt_logprob_from`: request
        id -> first wanted position; `device_tokens`: the placeholders' ids, on the device."""
        tiers = getattr(cache, "tiers", None)  # none on a tensor-parallel rank
        if tiers is not None:  # before any read
            tiers.transfer()
        copy_state_rows(self.state_tensors, out.state_restores)
        ids = list(out.num_scheduled_tokens)
        query_lens = [out.num_scheduled_tokens[r] for r in ids]
        context_lens = [requests[r].num_computed_tokens for r in ids]
        tables = [cache.block_table(r) for r in ids]
        slots = [cache.state_slot(r) for r in ids]
        tokens: list[int] = []
        num_pending = 0
        for r, c, q in zip(ids, context_lens, query_lens, strict=True):
            known = requests[r].all_token_ids[c : c + q] + out.spec_token_ids.get(r, [])
            tokens.extend(known)
            tokens.extend([0] * (q - len(known)))
            num_pending += q - len(known)
        if num_pending != (0 if device_tokens is None else len(device_tokens.dst)):
            raise ValueError(f"device_tokens: {num_pending} input ids are not on the host")
        hidden = None
        self.last_path = "eager"
        if self.graphs is not None and self.graphs.can_run(query_lens, context_lens):
            step = decode_inputs(tokens, context_lens, tables, slots, self.block_size)
            if self.multimodal is not None:  # M-RoPE: positions after an image are shifted
                step.positions = self.multimodal.decode_positions(ids, context_lens)
            try:
                hidden = self.graphs.run(step, device_tokens)
                self.last_path = "decode_graph"
            except CaptureFailed:
                hidden = None
        elif self._mixed_runs(out, query_lens, context_lens):
            step = mixed_inputs(tokens, query_lens, context_lens, tables, slots, self.block_size)
            try:
                hidden = self.mixed.run(step, device_tokens)
                self.last_path = "mixed_graph"
            except CaptureFailed:
                hidden = None
        if hidden is None:
            batch = build_forward_batch(
                query_lens=query_lens,
                context_lens=context_lens,
                block_tables=tables,
                state_indices=slots,
                block_size=self.block_size,
                caches=self.caches,
                device=self.device,
            )
            set_state_boundaries(batch, ids, context_lens, out.state_boundaries)
            input_ids = index_tensor(tokens, self.device)
            if device_tokens is not None:
                device_tokens.apply(input_ids)
            if self.multimodal is not None:
                mm = self.multimodal
                embeds = mm.embeddings(
                    ids, context_lens, query_lens, input_ids, self.model.embed_tokens
                )
                extra = () if embeds is None else (embeds,)
                positions = mm.positions(ids, context_lens, query_lens, batch.positions)
                hidden = self.model(input_ids, positions, batch, *extra)
            else:  # piecewise graphs take token ids and plain positions only
                hidden = self._forward(input_ids, batch)
        copy_state_rows(self.state_tensors, out.state_saves)
        return self._logits(
            ids, context_lens, query_lens, requests, hidden, prompt_logprob_from,
            out.spec_token_ids,
        )  # fmt: skip

    def _mixed_runs(
        self, out: SchedulerOutput, query_lens: list[int], context_lens: list[int]
    ) -> bool:
        return (
            self.mixed is not None
            and self.multimodal is None
            and not out.state_boundaries
            and self.mixed.key(query_lens, context_lens) is not None
        )

    def _forward(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        pieces = self.piecewise
        if pieces is not None and pieces.can_run(input_ids.shape[0]):
            hidden = pieces.run(input_ids, batch)
            if hidden is not None:
                return hidden
        return self.model(input_ids, batch.positions, batch)

    def _logits(
        self,
        ids: list[str],
        context_lens: list[int],
        query_lens: list[int],
        requests: dict[str, Request],
        hidden: torch.Tensor,
        prompt_logprob_from: dict[str, int] | None,
        spec_token_ids: dict[str, list[int]],
    ) -> RunnerOutput:
        result = RunnerOutput()
        sample_rows: list[int] = []
        spec_rows: list[int] = []
        prompt_rows: list[int] = []
        prompt_spans: list[tuple[str, int, int]] = []  # (request id, first position, end)
        start = 0
        for r, c, q in zip(ids, context_lens, query_lens, strict=True):
            req = requests[r]
            k = len(spec_token_ids.get(r, ()))
            if c + q - k == req.num_tokens:
                result.sample_ids.append(r)
                sample_rows.append(start + q - 1 - k)
                spec_rows.extend(range(start + q - k, start + q))
            if prompt_logprob_from and r in prompt_logprob_from:
                lo = max(c, prompt_logprob_from[r])
                hi = min(c + q, req.num_prompt_tokens - 1)
                if hi > lo:
                    prompt_spans.append((r, lo, hi))
                    prompt_rows.extend(range(start + lo - c, start + hi - c))
            start += q
        rows = sample_rows + spec_rows + prompt_rows
        if not rows:
            return result
        logits = self.model.compute_logits(_select_rows(hidden, rows))
        num_sampled = len(sample_rows) + len(spec_rows)
        result.logits = logits[:num_sampled]
        if prompt_spans:
            logprobs = torch.log_softmax(logits[num_sampled:].float(), dim=-1)
            cursor = 0
            for r, lo, hi in prompt_spans:
                req = requests[r]
                num = req.params.prompt_logprobs or 0
                result.prompt_logprobs[r] = [
                    top_logprobs(logprobs[cursor + p - lo], num, req.prompt_token_ids[p + 1])
                    for p in range(lo, hi)
                ]
                cursor += hi - lo
        return result


def _select_rows(hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """hidden[rows]; a slice when consecutive (an index tensor's copy waits for the forward)."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return hidden[rows[0] : rows[0] + len(rows)]
    return hidden[index_tensor(rows, hidden.device)]


def decode_inputs(
    tokens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    state_indices: list[int],
    block_size: int,
) -> DecodeInputs:
    slots = [t[c // block_size] * block_size + c % block_size for t, c in zip(
        block_tables, context_lens, strict=True)]  # fmt: skip
    return DecodeInputs(
        input_ids=list(tokens),
        positions=list(context_lens),
        slot_mapping=slots,
        state_indices=list(state_indices),
        seq_lens=[c + 1 for c in context_lens],
        block_tables=block_tables,
    )


def mixed_inputs(
    tokens: list[int],
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    state_indices: list[int],
    block_size: int,
) -> MixedInputs:
    positions: list[int] = []
    slots: list[int] = []
    for table, c, q in zip(block_tables, context_lens, query_lens, strict=True):
        positions.extend(range(c, c + q))
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(c, c + q))
    return MixedInputs(
        input_ids=list(tokens),
        positions=positions,
        slot_mapping=slots,
        state_indices=list(state_indices),
        seq_lens=[c + q for c, q in zip(context_lens, query_lens, strict=True)],
        has_state=[int(c > 0) for c in context_lens],
        query_lens=list(query_lens),
        block_tables=block_tables,
    )
