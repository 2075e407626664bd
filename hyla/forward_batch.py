"""The packed variable-length step: sequence i adds `query_lens[i]` tokens after `context_lens[i]`
cached ones; its token j lives at offset j % B of block `block_tables[i][j // B]`."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hyla.attention_metadata import AttentionMetadata
from hyla.cache.spec import layer_cache_specs
from hyla.config import ModelConfig
from hyla.ops.gpu import index_tensor  # noqa: F401 - used here and by importers

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

    positions, slot_mapping: [T] int64; cu_seqlens: [N + 1] int32; state_indices: [N] int64;
    block_tables: [N, max_blocks] int32 padded with 0. state_boundaries: per sequence, ascending
    new-token counts inside the chunk after which linear layers save state into `boundary_rows` [M].
    per_pass: `shared` values, emptied each pass so a captured pass never reads warm-up tensors."""

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
        """`compute()` once per forward pass under `key` (a function of this batch only)."""
        if key not in self.per_pass:
            self.per_pass[key] = compute()
        return self.per_pass[key]

    def __post_init__(self) -> None:
        if self.attn is None:
            lens = self.seq_lens
            device_lens = index_tensor(lens, self.positions.device, torch.int32)
            self.attn = AttentionMetadata.eager(lens, device_lens)

    @property
    def seq_lens_tensor(self) -> torch.Tensor:
        return self.attn.seq_lens

    @property
    def max_seq_len(self) -> int:
        return self.attn.max_seq_len

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))

    @property
    def cu_seqlens_host(self) -> list[int]:
        return list(itertools.accumulate(self.query_lens, initial=0))

    @property
    def seq_lens(self) -> list[int]:
        return [c + q for c, q in zip(self.context_lens, self.query_lens, strict=True)]

    @property
    def has_initial_state(self) -> list[bool]:
        return [c > 0 for c in self.context_lens]

    @property
    def is_pure_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)


@dataclass(frozen=True)
class DeviceTokens:
    """Step inputs still on the device: input id `dst[i]` takes `tokens[src[i]]` ([m] int64)."""

    tokens: torch.Tensor
    dst: tuple[int, ...]
    src: tuple[int, ...]

    def apply(self, input_ids: torch.Tensor) -> None:
        """Write the device tokens into `input_ids` [T] in place, without a host wait."""
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
    """Zero caches per layer: "token" specs `[num_blocks, block_size, *shape]`, "slot"
    `[num_slots, ...]`."""
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
    """A ForwardBatch from host bookkeeping. Raises ValueError when a block table is too short."""
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
    return ForwardBatch(
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
    )
