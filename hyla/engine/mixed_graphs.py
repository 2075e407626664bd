"""CUDA graphs for whole mixed prefill+decode steps, captured per (Tb, Nb, Lb).

    sequences:  | s0 .. s(N-1) (real) | pad: Tb - T tokens | empty x (Nb - N - 1) |
    cu_seqlens:  0 ...            T                        Tb   Tb ... Tb
The pad sequence has no state, state slot 0 and null block 0: padding touches only reserved storage.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hyla.attention_metadata import AttentionMetadata
from hyla.config import ModelConfig
from hyla.engine.cuda_graphs import BATCH_SIZES, CaptureFailed, context_bucket
from hyla.forward_batch import DeviceTokens, ForwardBatch, LayerCache
from hyla.models.hybrid import HybridModel

logger = logging.getLogger("hyla.engine")

MIXED_GRAPH_MIXERS = frozenset({"kda", "mla"})  # fla's fixed-grid chunk plan: KDA only (0.6)
TOKEN_STEP = 128
MAX_TOKENS = 2048  # larger steps are compute-bound: eager
_TOKEN_FIELDS = ("input_ids", "positions", "slot_mapping")
_SEQ_FIELDS = ("state_indices", "seq_lens", "has_state", "cu_seqlens")


def mixed_graph_buckets(config: ModelConfig, max_num_batched_tokens: int) -> tuple[int, ...]:
    if config.hc_mult > 1 or any(k not in MIXED_GRAPH_MIXERS for k in config.layer_pattern):
        return ()
    top = min(MAX_TOKENS, max_num_batched_tokens)
    sizes = {16, 32, 64} | set(range(TOKEN_STEP, top + 1, TOKEN_STEP))
    return tuple(sorted(s for s in sizes if s <= top))


@dataclass
class MixedInputs:
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    state_indices: list[int]
    seq_lens: list[int]
    has_state: list[int]
    query_lens: list[int]
    block_tables: list[list[int]]


class _MixedStatic:
    def __init__(self, key, block_size: int, caches: list[LayerCache], device) -> None:
        self.tokens, self.seqs, bucket = key
        self.width = -(-bucket // block_size)
        n = len(_TOKEN_FIELDS) * self.tokens + len(_SEQ_FIELDS) * (self.seqs + 1)
        self.flat = torch.zeros(n, dtype=torch.long, device=device)
        self.tables = torch.zeros(self.seqs, self.width, dtype=torch.int32, device=device)
        pin = device.type == "cuda"
        self.host_flat = torch.zeros(n, dtype=torch.long, pin_memory=pin)
        self.host_tables = torch.zeros(self.tables.shape, dtype=torch.int32, pin_memory=pin)
        self.copied = torch.cuda.Event() if pin else None
        t, s = self.tokens, self.seqs + 1
        views = self.flat.split([t] * len(_TOKEN_FIELDS) + [s] * len(_SEQ_FIELDS))
        self.view = dict(zip(_TOKEN_FIELDS + _SEQ_FIELDS, views, strict=True))
        cu = self.view["cu_seqlens"].to(torch.int32)  # a copy: refreshed inside the graph
        self.cu32 = cu
        attn = AttentionMetadata.static(self.view["seq_lens"][: self.seqs], bucket)
        self.batch = ForwardBatch(
            positions=self.view["positions"],
            cu_seqlens=cu,
            query_lens=[1] * self.seqs,  # placeholders: only the device holds the step's
            context_lens=[bucket - 1] * self.seqs,
            block_tables=self.tables,
            slot_mapping=self.view["slot_mapping"],
            state_indices=self.view["state_indices"][: self.seqs],
            state_indices_host=None,
            block_size=block_size,
            caches=caches,
            attn=attn.with_state_mask(self.view["has_state"][: self.seqs]),
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.hidden: torch.Tensor | None = None

    def load(self, step: MixedInputs) -> None:
        pad_tokens = self.tokens - len(step.input_ids)
        empty = self.seqs - len(step.query_lens) - 1
        cu = [0]
        for q in [*step.query_lens, pad_tokens] + [0] * empty:
            cu.append(cu[-1] + q)
        values = (
            step.input_ids + [0] * pad_tokens,
            step.positions + list(range(pad_tokens)),
            step.slot_mapping + [0] * pad_tokens,
            step.state_indices + [0] * (empty + 2),
            step.seq_lens + [pad_tokens] + [0] * (empty + 1),
            step.has_state + [0] * (empty + 2),
            cu,
        )
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copy has left the pinned buffers
        self.host_flat.copy_(torch.tensor([v for part in values for v in part]))
        self.host_tables.zero_()
        for i, table in enumerate(step.block_tables):
            end = min(len(table), self.width)
            self.host_tables[i, :end] = torch.tensor(table[:end], dtype=torch.int32)
        self.flat.copy_(self.host_flat, non_blocking=True)
        self.tables.copy_(self.host_tables, non_blocking=True)
        if self.copied is not None:
            self.copied.record()


class MixedGraphs:
    """Captured mixed steps of one model; `capture=False` runs them eagerly (any device)."""

    def __init__(
        self,
        model: HybridModel,
        caches: list[LayerCache],
        block_size: int,
        token_buckets: tuple[int, ...],
        max_model_len: int | None = None,
        capture: bool = True,
    ) -> None:
        self.model, self.caches, self.block_size = model, caches, block_size
        self.token_buckets = token_buckets
        self.max_model_len = max_model_len
        self.capture = capture
        self.device = next(model.parameters()).device
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.steps: dict[tuple[int, int, int], _MixedStatic] = {}
        self.num_replayed_steps = 0

    def key(self, query_lens: list[int], context_lens: list[int]) -> tuple[int, int, int] | None:
        """(Tb, Nb, Lb) of a step; None (eager) when no bucket holds it or half is padding."""
        num_tokens = sum(query_lens)
        tokens = next((b for b in self.token_buckets if b >= num_tokens), None)
        seqs = next((b for b in BATCH_SIZES if b >= len(query_lens) + 1), None)
        if tokens is None or seqs is None or not query_lens or 2 * num_tokens < tokens:
            return None
        longest = max(
            max(c + q for c, q in zip(context_lens, query_lens, strict=True)), tokens - num_tokens
        )
        return tokens, seqs, context_bucket(longest, self.max_model_len)

    def run(self, step: MixedInputs, device_tokens: DeviceTokens | None = None) -> torch.Tensor:
        """Hidden states [T, D], a view valid until the next step; ValueError if it does not fit."""
        key = self.key(
            step.query_lens, [n - q for n, q in zip(step.seq_lens, step.query_lens, strict=True)]
        )
        if key is None:
            raise ValueError(f"mixed graphs: a step of {len(step.input_ids)} tokens does not fit")
        static = self.steps.get(key)
        if static is None:
            static = self._build(key)
        static.load(step)
        if device_tokens is not None:
            device_tokens.apply(static.view["input_ids"])
        if static.graph is None:
            hidden = self._forward(static)
        else:
            static.graph.replay()
            hidden = static.hidden
            self.num_replayed_steps += 1
        return hidden[: len(step.input_ids)]

    def _forward(self, static: _MixedStatic) -> torch.Tensor:
        static.cu32.copy_(static.view["cu_seqlens"])
        return self.model(static.view["input_ids"], static.batch.positions, static.batch)

    def _build(self, key: tuple[int, int, int]) -> _MixedStatic:
        static = _MixedStatic(key, self.block_size, self.caches, self.device)
        self.steps[key] = static
        if not self.capture:
            return static
        current = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(self.device)
        graph = torch.cuda.CUDAGraph()
        static.load(_idle_step())  # warm-up and capture run the padding sequence alone
        try:
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(static)
            current.wait_stream(stream)
            with torch.cuda.graph(graph, pool=self.pool):
                static.hidden = self._forward(static)
        except RuntimeError as err:
            torch.cuda.set_stream(current)
            self.token_buckets, self.steps = (), {}
            logger.warning("mixed CUDA graph capture failed (%s); mixed steps run eagerly "
                           "from now on: %s", key, err)  # fmt: skip
            raise CaptureFailed(str(err)) from err
        static.graph = graph
        logger.info("captured the mixed-step graph for %d tokens, %d sequences, context <= %d",
                    *key)  # fmt: skip
        return static


def _idle_step() -> MixedInputs:
    return MixedInputs([], [], [], [], [], [], [], [])
