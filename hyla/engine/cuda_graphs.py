"""CUDA graphs for decode steps: capture the model's forward once per (batch bucket, context
bucket) and replay it with new inputs, so a decode step costs one graph launch instead of
hundreds of kernel launches from Python.

    decode step: N sequences, one new token each after >= 1 cached token, longest L tokens
      -> graph (Bp, Lb): Bp = smallest captured batch size >= N,
                         Lb = smallest power of two >= max(L, MIN_CONTEXT), at most
                              the engine's max_model_len
    rows N .. Bp - 1 are padding: token 0 at position 0, written to cache slot 0 (the reserved
    null block 0) with state slot 0 (the reserved padding slot) and length 1, so they read and
    write only reserved storage, never a real sequence's cache or state.

A captured step is a `ForwardBatch` whose `AttentionMetadata.static` holds its capture buffers:
its host lists describe the capture, and the layers take lengths from `attn.seq_lens` and sizes
from `attn.max_seq_len` (= Lb) only (`hyla.attention_metadata`). Its inputs live in one int64
device buffer (token ids, positions, slot mapping, state slots, lengths) and one int32 block
table [Bp, Lb / B], filled per step by two host-to-device copies from pinned memory.

Which steps can run captured: pure decode steps (no sequence at context 0: `can_run`) on CUDA
with triton (and fla-core for KDA / GDN layers: `kernels_capturable`), of models whose mixers
read lengths on the device (`GRAPH_MIXERS`), at batch sizes where every MoE layer takes a
sync-free form (`hyla.ops.moe.kernels.sync_free`). Should a capture fail all the same, the
graphs turn themselves off (`CaptureFailed`) and decode runs eagerly. Graphs are captured
lazily, on a step's first use of a (Bp, Lb) pair, and share one memory pool (replays never
overlap). With `capture=False` the same static-shape step runs eagerly: the CPU tests use it to
check padding and bucketing against the plain step.
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
MIN_CONTEXT = 256  # smallest context bucket (a power of two)
GRAPH_MIXERS = frozenset({"mla", "dsa", "kda", "gdn", "gqa"})
# GQA's captured form gathers [Bp, Lb, HKV, K] keys and values: steps past Bp * Lb rows run
# eagerly (one sequence at a time) instead (1M rows: 2 GiB of K and V at HKV * K = 512, bf16)
GATHER_ROWS = 1 << 20
_FIELDS = ("input_ids", "positions", "slot_mapping", "state_indices", "seq_lens")


class CaptureFailed(RuntimeError):
    """A decode step could not be captured (an op on the decode path read the device back, or
    is not capturable); the `DecodeGraphs` turned itself off and the step should run eagerly."""


def graph_batch_sizes(config: ModelConfig, max_num_seqs: int) -> tuple[int, ...]:
    """The batch buckets whose decode steps can be captured, ascending: `BATCH_SIZES` below
    `max_num_seqs` plus `max_num_seqs` itself, keeping the sizes at which every MoE layer is
    sync-free; empty when a mixer kind is not in `GRAPH_MIXERS`."""
    if any(kind not in GRAPH_MIXERS for kind in config.layer_pattern):
        return ()
    sizes = sorted({b for b in BATCH_SIZES if b < max_num_seqs} | {max_num_seqs})
    if config.moe is not None and "moe" in config.ffn_pattern:
        moe = config.moe
        sizes = [b for b in sizes if sync_free(b, moe.num_experts_per_tok, moe.num_experts)]
    return tuple(sizes)


def kernels_capturable(config: ModelConfig) -> bool:
    """Whether this process has the GPU kernels a captured step needs: triton (MLA / DSA, norms,
    cache writes) and, for KDA / GDN layers, fla-core (whose recurrent kernel updates the state
    pool in place; hyla's PyTorch fallback gathers slots with host reads)."""
    from hyla.ops.gpu import triton_available
    from hyla.ops.kda.kernels import fla_available

    linear = any(kind in ("kda", "gdn") for kind in config.layer_pattern)
    return triton_available() and (fla_available() or not linear)


def context_bucket(max_seq_len: int, max_model_len: int | None = None) -> int:
    """Smallest power of two >= max(max_seq_len, MIN_CONTEXT), capped at `max_model_len` (a step
    never holds a longer sequence, so the last bucket is the model's length limit)."""
    bucket = max(MIN_CONTEXT, 1 << max(0, max_seq_len - 1).bit_length())
    return bucket if max_model_len is None else max(max_seq_len, min(bucket, max_model_len))


@dataclass
class DecodeInputs:
    """One decode step's host inputs, N rows: token id, position, cache slot, state slot,
    length (context + 1) and block table of each sequence."""

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
    """The tensors of one (Bp, Lb) static step, its ForwardBatch, and its graph once captured."""

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
        self.row_tables: list[list[int] | None] = [None] * size  # table object loaded per row
        self.row_written = [0] * size  # entries of it in host_tables
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
            attn=AttentionMetadata.static(view["seq_lens"], bucket),  # over the capture buffer
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.hidden: torch.Tensor | None = None

    def load(self, step: DecodeInputs) -> None:
        """Copy `step` into the static tensors; padding rows get the reserved slot 0 / block 0,
        position 0, length 1. Block-table rows are written incrementally (`_load_tables`)."""
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
        """Write each row's block table into `host_tables`, only its new entries when the row
        holds the same table object as last step (the cache manager's tables are append-only
        lists while their sequence lives: a 1M-token table rebuilt every step would cost ~1 ms
        of host time). Blocks past the bucket hold no token of the step and are left out."""
        for i in range(self.size):
            table = tables[i] if i < len(tables) else None
            if table is None:
                if self.row_tables[i] is not None or self.row_written[i]:
                    self.host_tables[i].zero_()  # padding: the null block 0
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
    """Captured decode steps of one model over its caches (see the module docstring).

    Args:
        model: the hybrid decoder; its parameters' device runs the steps.
        caches: the model's cache tensors (`hyla.forward_batch.allocate_caches`).
        block_size: tokens per cache block.
        batch_sizes: ascending captured batch sizes (`graph_batch_sizes`).
        capture: False runs the static-shape steps eagerly (no CUDA graph; any device).
        max_model_len: caps the context buckets (`context_bucket`); None: powers of two only.
    """

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
        """Whether a step with these new-token and cached-token counts runs captured: the batch
        fits, it is a pure decode, one new token after a non-empty context per sequence (a
        static step's host `context_lens` are placeholders, so its linear layers always read
        their state slots: a sequence's first token must start from the zero state eagerly),
        and for models with GQA layers the padded batch times the context bucket is at most
        `GATHER_ROWS`."""
        return (
            all(q == 1 for q in query_lens)
            and all(c > 0 for c in context_lens)
            and self._key(len(query_lens), context_lens) is not None
        )

    def _key(self, num_seqs: int, context_lens: list[int]) -> tuple[int, int] | None:
        """(batch bucket, context bucket) of a step of `num_seqs` rows; None when no captured
        batch size holds it or, with GQA layers, past `max_rows`."""
        size = next((b for b in self.batch_sizes if b >= num_seqs), None)
        if size is None or num_seqs == 0:
            return None
        bucket = context_bucket(max(context_lens) + 1, self.max_model_len)
        if self.max_rows is not None and size * bucket > self.max_rows:
            return None
        return size, bucket

    def run(self, step: DecodeInputs, device_tokens: DeviceTokens | None = None) -> torch.Tensor:
        """Run one decode step: hidden states [N, D] (a view of the graph's output, valid until
        the next step); `device_tokens` replace input ids still on the device. Raises
        ValueError when the step does not fit (`can_run`)."""
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
            with torch.cuda.stream(stream):  # compile and autotune the kernels outside the graph
                for _ in range(2):
                    self._forward(static)
            current.wait_stream(stream)
            with torch.cuda.graph(graph, pool=self.pool):
                static.hidden = self._forward(static)
        except RuntimeError as err:  # out of memory, or an op that cannot be captured
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
