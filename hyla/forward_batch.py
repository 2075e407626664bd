"""The one structure that carries a packed variable-length step into the model.

A step packs N sequences' new tokens into T rows. Sequence i contributes `query_lens[i]` new
tokens that follow `context_lens[i]` tokens already in its cache:

    tokens:      | seq0 new tokens | seq1 new tokens | ... |
    cu_seqlens:  0                 q0                q0+q1 ...  (int32, N + 1 entries)
    positions:   c0, c0+1, ...     c1, c1+1, ...              (absolute positions)

Attention-like layers write each new token's entry at `slot_mapping[t]` of their paged cache
(viewed as `[num_blocks * block_size, ...]`; slot = block_id * block_size + offset) and read a
sequence's whole context through `block_tables[i]`:

    block_tables[i] = [b7, b2, b9, ...]   token j of seq i lives in block
                                          b = block_tables[i][j // B] at offset j % B

Linear layers read and write one state slot per sequence, `state_indices[i]`; when
`context_lens[i] == 0` the slot's previous contents are ignored (zero initial state).

Lengths the layers read (device lengths, a host bound, host lengths when the host has them)
travel in one `AttentionMetadata` (`batch.attn`), built once per step: from the host lists for
an eager step, over the capture buffers of a CUDA-graph decode step (`hyla.engine.cuda_graphs`),
whose host lists describe the capture, not the step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hyla.attention_metadata import AttentionMetadata
from hyla.cache.spec import layer_cache_specs
from hyla.config import ModelConfig

TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}

LayerCache = dict[str, torch.Tensor]


@dataclass
class ForwardBatch:
    """Inputs of one model step besides the token ids.

    Attributes:
        positions: [T] int64 absolute position of each new token.
        cu_seqlens: [N + 1] int32 offsets of each sequence's new tokens in the packed rows.
        query_lens: host list of N new-token counts.
        context_lens: host list of N counts of tokens already cached before this step.
        block_tables: [N, max_blocks] int32 block ids (rows padded with 0 past the sequence).
        slot_mapping: [T] int64 flat cache slot of each new token.
        state_indices: [N] int64 state slot of each sequence (linear layers).
        state_indices_host: the same slots as a host list (reading the tensor would cost a
            device sync on a GPU); None in a static step (only the device has the step's).
        block_size: tokens per block B.
        caches: per layer index, that layer's cache tensors by name (see `hyla.cache.spec`).
        attn: the step's lengths for the layers (`AttentionMetadata`); built from the host
            lists when not given.
        state_boundaries: prefix-cache checkpoints inside this step's chunks: per sequence, the
            new-token counts b (0 < b < query_len, ascending) after which the linear layers
            write their recurrent and conv state into the state rows `boundary_rows` [M]
            (sequence-major); None when there are none.
        per_pass: values computed once per forward pass from the batch alone and shared by its
            layers (`shared`); `HybridModel.forward` empties it at the start of every pass, so a
            captured pass recomputes them inside the graph and never reads a warm-up's tensors.
    """

    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    query_lens: list[int]
    context_lens: list[int]
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    state_indices: torch.Tensor
    state_indices_host: list[int] | None
    block_size: int
    caches: list[LayerCache] = field(default_factory=list)
    attn: AttentionMetadata | None = None
    state_boundaries: list[list[int]] | None = None
    boundary_rows: torch.Tensor | None = None
    per_pass: dict = field(default_factory=dict, repr=False, compare=False)

    def shared(self, key: object, compute: Callable[[], Any]) -> Any:
        """`compute()` once per forward pass under `key` (a function of this batch only: e.g.
        each row's sequence and position, the same for every attention layer of the pass)."""
        if key not in self.per_pass:
            self.per_pass[key] = compute()
        return self.per_pass[key]

    def __post_init__(self) -> None:
        if self.attn is None:  # from the host lists (no device read)
            lens = self.seq_lens
            device_lens = index_tensor(lens, self.positions.device, torch.int32)
            self.attn = AttentionMetadata.eager(lens, device_lens)

    @property
    def seq_lens_tensor(self) -> torch.Tensor:
        """[N] lengths on the device (`attn.seq_lens`)."""
        return self.attn.seq_lens

    @property
    def max_seq_len(self) -> int:
        """A host bound on the lengths (`attn.max_seq_len`)."""
        return self.attn.max_seq_len

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))

    @property
    def cu_seqlens_host(self) -> list[int]:
        """`cu_seqlens` as host ints, from `query_lens` (no device sync)."""
        return list(itertools.accumulate(self.query_lens, initial=0))

    @property
    def seq_lens(self) -> list[int]:
        """Context plus new tokens, per sequence (host list)."""
        return [c + q for c, q in zip(self.context_lens, self.query_lens, strict=True)]

    @property
    def has_initial_state(self) -> list[bool]:
        return [c > 0 for c in self.context_lens]

    @property
    def is_pure_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)


def index_tensor(
    values: list, device: torch.device | str, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """`values` (host ints, nested lists for more dims) as a `dtype` tensor on `device`. To a
    GPU the copy goes from pinned memory, queued on the stream: the host does not wait for the
    work already queued (a copy from pageable memory would: CUDA drains the stream first)."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class DeviceTokens:
    """Input tokens of a step that are still on the device (async scheduling): entry `dst[i]`
    of the step's flat input ids takes `tokens[src[i]]`, the token the previous step sampled
    (the host holds a placeholder there until that step's results are read).

    Attributes:
        tokens: [m] int64 on the step device, the previous step's sampled tokens by row.
        dst: indices into the step's input ids (token order of the packed batch).
        src: rows of `tokens`, one per `dst` entry.
    """

    tokens: torch.Tensor
    dst: tuple[int, ...]
    src: tuple[int, ...]

    def apply(self, input_ids: torch.Tensor) -> None:
        """Write the device tokens into `input_ids` ([T] int64, the step's device) in place,
        queued on the current stream (no host wait)."""
        if not self.dst:
            return
        idx = index_tensor([*self.dst, *self.src], input_ids.device).view(2, -1)
        input_ids.index_copy_(0, idx[0], self.tokens.index_select(0, idx[1]))


def allocate_caches(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    num_slots: int,
    device: torch.device | str = "cpu",
) -> list[LayerCache]:
    """Allocate every layer's cache tensors, zero-filled.

    Returns: a list with one dict per layer; "token" tensors are `[num_blocks, block_size, *shape]`,
    "slot" tensors `[num_slots, *shape]`, dtypes from `hyla.cache.spec`.
    """
    caches: list[LayerCache] = []
    for i in range(config.num_layers):
        layer: LayerCache = {}
        for spec in layer_cache_specs(config, i):
            lead = (num_blocks, block_size) if spec.per == "token" else (num_slots,)
            layer[spec.name] = torch.zeros(
                lead + spec.shape, dtype=TORCH_DTYPES[spec.dtype], device=device
            )
        caches.append(layer)
    return caches


def build_forward_batch(
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    state_indices: list[int],
    block_size: int,
    caches: list[LayerCache],
    device: torch.device | str = "cpu",
) -> ForwardBatch:
    """Build a ForwardBatch from host-side bookkeeping (block ids and state slots per sequence).

    Raises:
        ValueError: a sequence's block table is too short for its context plus new tokens.
    """
    positions: list[int] = []
    slots: list[int] = []
    for i, (q, c) in enumerate(zip(query_lens, context_lens, strict=True)):
        table = block_tables[i]
        if (c + q + block_size - 1) // block_size > len(table):
            raise ValueError(
                f"block_tables[{i}]: {len(table)} blocks cannot hold {c + q} tokens "
                f"of block_size {block_size}"
            )
        for pos in range(c, c + q):
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    width = max((len(t) for t in block_tables), default=0) or 1
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    cu = list(itertools.accumulate(query_lens, initial=0))
    return ForwardBatch(  # copies to a GPU queued from pinned memory (`index_tensor`)
        positions=index_tensor(positions, device),
        cu_seqlens=index_tensor(cu, device, torch.int32),
        query_lens=list(query_lens),
        context_lens=list(context_lens),
        block_tables=index_tensor(padded, device, torch.int32).reshape(-1, width),
        slot_mapping=index_tensor(slots, device),
        state_indices=index_tensor(state_indices, device),
        state_indices_host=list(state_indices),
        block_size=block_size,
        caches=caches,
    )  # its AttentionMetadata from the host lists (__post_init__)
