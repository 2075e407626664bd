"""CUDA graphs for decode steps, captured lazily per (Bp, Lb), sharing one memory pool: for N
sequences of longest L, Bp = smallest batch size >= N, Lb = pow2 >= max(L, MIN_CONTEXT). Rows
N .. Bp - 1 are padding (token 0, position 0, cache slot 0 of the null block, state slot 0,
length 1), so they touch only reserved storage. Layers read lengths from `attn.seq_lens`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hyla.attention_metadata import AttentionMetadata
from hyla.config import ModelConfig
from hyla.forward_batch import DeviceTokens, ForwardBatch, LayerCache
from hyla.models.hybrid import HybridModel
from hyla.ops.moe.kernels import sync_free

logger = logging.getLogger("hyla.engine")

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
MIN_CONTEXT = 256
GRAPH_MIXERS = frozenset({"mla", "dsa", "kda", "gdn", "gqa"})
# Captured GQA gathers [Bp, Lb, HKV, K] keys and values: past this many rows, run eagerly.
GATHER_ROWS = 1 << 20
_FIELDS = ("input_ids", "positions", "slot_mapping", "state_indices", "seq_lens")


class CaptureFailed(RuntimeError):
    """A decode step could not be captured; the graphs turned off, run the step eagerly."""


def graph_batch_sizes(config: ModelConfig, max_num_seqs: int) -> tuple[int, ...]:
    """Capturable batch buckets, ascending: those where every MoE layer is sync-free."""
    if any(kind not in GRAPH_MIXERS for kind in config.layer_pattern):
        return ()
    sizes = sorted({b for b in BATCH_SIZES if b < max_num_seqs} | {max_num_seqs})
    if config.moe is not None and "moe" in config.ffn_pattern:
        moe = config.moe
        sizes = [b for b in sizes if sync_free(b, moe.num_experts_per_tok, moe.num_experts)]
    return tuple(sizes)


def kernels_capturable(config: ModelConfig) -> bool:
    """Triton, and for KDA / GDN fla-core (the PyTorch fallback reads slots on the host)."""
    from hyla.ops.gpu import triton_available
    from hyla.ops.kda.kernels import fla_available

    linear = any(kind in ("kda", "gdn") for kind in config.layer_pattern)
    return triton_available() and (fla_available() or not linear)


def context_bucket(max_seq_len: int, max_model_len: int | None = None) -> int:
    bucket = max(MIN_CONTEXT, 1 << max(0, max_seq_len - 1).bit_length())
    return bucket if max_model_len is None else max(max_seq_len, min(bucket, max_model_len))


@dataclass
class DecodeInputs:
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    state_indices: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]

    @property
    def num_seqs(self) -> int:
        return len(self.input_ids)


class _StaticStep:
    def __init__(
        self, size: int, bucket: int, block_size: int, caches: list[LayerCache], device
    ) -> None:
        self.size, self.width = size, -(-bucket // block_size)
        self.flat = torch.zeros(len(_FIELDS) * size, dtype=torch.long, device=device)
        self.tables = torch.zeros(size, self.width, dtype=torch.int32, device=device)
        pin = device.type == "cuda"
        self.host_flat = torch.zeros(self.flat.shape, dtype=torch.long, pin_memory=pin)
        self.host_tables = torch.zeros(self.tables.shape, dtype=torch.int32, pin_memory=pin)
        self.copied = torch.cuda.Event() if pin else None
        self.row_tables: list[list[int] | None] = [None] * size
        self.row_written = [0] * size
        view = dict(zip(_FIELDS, self.flat.view(len(_FIELDS), size), strict=True))
        self.input_ids = view["input_ids"]
        view["seq_lens"].fill_(1)
        self.batch = ForwardBatch(
            positions=view["positions"],
            cu_seqlens=torch.arange(size + 1, dtype=torch.int32, device=device),
            query_lens=[1] * size,
            context_lens=[bucket - 1] * size,
            block_tables=self.tables,
            slot_mapping=view["slot_mapping"],
            state_indices=view["state_indices"],
            state_indices_host=None,
            block_size=block_size,
            caches=caches,
            attn=AttentionMetadata.static(view["seq_lens"], bucket),
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.hidden: torch.Tensor | None = None

    def load(self, step: DecodeInputs) -> None:
        pad = self.size - step.num_seqs
        values: list[int] = []
        for name in _FIELDS:
            values += getattr(step, name) + [1 if name == "seq_lens" else 0] * pad
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copy has left the pinned buffers
        self.host_flat.copy_(torch.tensor(values, dtype=torch.long))
        self._load_tables(step.block_tables)
        self.flat.copy_(self.host_flat, non_blocking=True)
        self.tables.copy_(self.host_tables, non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def _load_tables(self, tables: list[list[int]]) -> None:
        # Tables are append-only while their sequence lives: write only a same object's new tail.
        for i in range(self.size):
            table = tables[i] if i < len(tables) else None
            if table is None:
                if self.row_tables[i] is not None or self.row_written[i]:
                    self.host_tables[i].zero_()
                self.row_tables[i], self.row_written[i] = None, 0
                continue
            end = min(len(table), self.width)
            start = self.row_written[i] if self.row_tables[i] is table else 0
            if start > end:
                start = 0
            if start == 0 and self.row_written[i]:
                self.host_tables[i].zero_()
            if end > start:
                self.host_tables[i, start:end] = torch.tensor(table[start:end], dtype=torch.int32)
            self.row_tables[i], self.row_written[i] = table, end


class DecodeGraphs:
    """Captured decode steps of one model; `capture=False` runs them eagerly (any device)."""

    def __init__(
        self,
        model: HybridModel,
        caches: list[LayerCache],
        block_size: int,
        batch_sizes: tuple[int, ...],
        capture: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        self.model = model
        self.caches = caches
        self.block_size = block_size
        self.batch_sizes = batch_sizes
        self.capture = capture
        self.max_model_len = max_model_len
        self.device = next(model.parameters()).device
        self.max_rows = GATHER_ROWS if "gqa" in model.config.layer_pattern else None
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.steps: dict[tuple[int, int], _StaticStep] = {}

    def can_run(self, query_lens: list[int], context_lens: list[int]) -> bool:
        """Pure decode with a non-empty context per sequence (linear layers always read their
        state slot, so a first token runs eagerly from the zero state), and the batch fits."""
        return (
            all(q == 1 for q in query_lens)
            and all(c > 0 for c in context_lens)
            and self._key(len(query_lens), context_lens) is not None
        )

    def _key(self, num_seqs: int, context_lens: list[int]) -> tuple[int, int] | None:
        size = next((b for b in self.batch_sizes if b >= num_seqs), None)
        if size is None or num_seqs == 0:
            return None
        bucket = context_bucket(max(context_lens) + 1, self.max_model_len)
        if self.max_rows is not None and size * bucket > self.max_rows:
            return None
        return size, bucket

    def run(self, step: DecodeInputs, device_tokens: DeviceTokens | None = None) -> torch.Tensor:
        """Hidden states [N, D], a view valid until the next step; `device_tokens` replace input
        ids still on the device. Raises ValueError when the step does not fit (`can_run`)."""
        context_lens = [n - 1 for n in step.seq_lens]  # not positions: M-RoPE shifts them
        key = self._key(step.num_seqs, context_lens)
        if key is None or min(context_lens) <= 0:
            raise ValueError(f"decode graphs: batch of {step.num_seqs} rows does not fit")
        static = self.steps.get(key)
        if static is None:
            static = self.steps[key] = self._build(*key)
        static.load(step)
        if device_tokens is not None:
            device_tokens.apply(static.input_ids)
        if static.graph is None:
            hidden = self._forward(static)
        else:
            static.graph.replay()
            hidden = static.hidden
        return hidden[: step.num_seqs]

    def _forward(self, static: _StaticStep) -> torch.Tensor:
        return self.model(static.input_ids, static.batch.positions, static.batch)

    def _build(self, size: int, bucket: int) -> _StaticStep:
        static = _StaticStep(size, bucket, self.block_size, self.caches, self.device)
        if not self.capture:
            return static
        current = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(self.device)
        graph = torch.cuda.CUDAGraph()
        try:
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(static)
            current.wait_stream(stream)
            with torch.cuda.graph(graph, pool=self.pool):
                static.hidden = self._forward(static)
        except RuntimeError as err:
            torch.cuda.set_stream(current)  # a failed capture_end leaves the capture stream set
            self.batch_sizes, self.steps = (), {}
            logger.warning(
                "CUDA graph capture failed (batch %d, context <= %d); decode steps run eagerly "
                "from now on: %s", size, bucket, err,
            )  # fmt: skip
            raise CaptureFailed(str(err)) from err
        static.graph = graph
        logger.info("captured the decode graph for batch %d, context <= %d", size, bucket)
        return static
