"""Copies of whole linear-layer state rows (slots, then checkpoints) across every per-slot
tensor of every layer, so a prefix's recurrent and conv states travel together."""

from __future__ import annotations

import torch

from hyla.cache.spec import layer_cache_specs
from hyla.config import ModelConfig
from hyla.forward_batch import ForwardBatch, LayerCache, index_tensor


def state_tensors(config: ModelConfig, caches: list[LayerCache]) -> list[torch.Tensor]:
    return [
        caches[i][spec.name]
        for i in range(config.num_layers)
        for spec in layer_cache_specs(config, i)
        if spec.per == "slot"
    ]


def copy_state_rows(tensors: list[torch.Tensor], copies: list[tuple[int, int]]) -> None:
    """`t[dst] = t[src]` for each (src, dst) and every `t: [rows, ...]`; sources read first."""
    if not copies or not tensors:
        return
    device = tensors[0].device
    src = index_tensor([s for s, _ in copies], device)
    dst = index_tensor([d for _, d in copies], device)
    for t in tensors:
        t.index_copy_(0, dst, t.index_select(0, src))


def set_state_boundaries(
    batch: ForwardBatch,
    ids: list[str],
    context_lens: list[int],
    boundaries: dict[str, list[tuple[int, int]]],
) -> None:
    """This step's checkpoints inside a chunk: `ids[i]`'s (tokens computed, state row) pairs
    become `batch.state_boundaries[i]` (tokens into its chunk) and `batch.boundary_rows`."""
    if not boundaries:
        return
    marks = [
        [end - c for end, _ in boundaries.get(r, ())]
        for r, c in zip(ids, context_lens, strict=True)
    ]
    rows = [row for r in ids for _, row in boundaries.get(r, ())]
    batch.state_boundaries = marks
    batch.boundary_rows = index_tensor(rows, batch.state_indices.device)
