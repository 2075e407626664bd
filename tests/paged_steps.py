"""Drive one mixer layer over a paged, NaN-poisoned cache, chunk by chunk (layer tests)."""

from __future__ import annotations

import random

import torch
from torch import nn

from hyla.config import ModelConfig
from hyla.forward_batch import allocate_caches, build_forward_batch


class PagedSteps:
    """Feeds chunks of hidden states of N sequences to one layer over a NaN-poisoned cache."""

    def __init__(
        self, config: ModelConfig, num_seqs: int, max_len: int, block_size: int, seed: int = 0
    ) -> None:
        self.block_size = block_size
        per_seq = (max_len + self.block_size - 1) // self.block_size
        blocks = list(range(1, num_seqs * per_seq + 1))
        random.Random(seed).shuffle(blocks)
        self.tables = [blocks[i * per_seq : (i + 1) * per_seq] for i in range(num_seqs)]
        self.caches = allocate_caches(config, len(blocks) + 1, self.block_size, num_seqs + 1)
        for t in self.caches[0].values():
            t.fill_(float("nan"))
        self.lens = [0] * num_seqs

    @torch.no_grad()
    def step(self, layer: nn.Module, chunks: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        ids = list(chunks)
        batch = build_forward_batch(
            [len(chunks[i]) for i in ids],
            [self.lens[i] for i in ids],
            [self.tables[i] for i in ids],
            list(range(1, len(ids) + 1)),
            self.block_size,
            self.caches,
        )
        out = layer(torch.cat([chunks[i] for i in ids]), batch.positions, batch)
        cu = batch.cu_seqlens.tolist()
        for i in ids:
            self.lens[i] += len(chunks[i])
        return {i: out[cu[n] : cu[n + 1]] for n, i in enumerate(ids)}
