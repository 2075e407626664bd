"""A minimal stateful runner over fixed sequences for tests and parity checks: each sequence owns
private, non-contiguous blocks and a state slot, as the engine's `ModelRunner` over shared pools."""

from __future__ import annotations

import random

import torch

from hyla.forward_batch import allocate_caches, build_forward_batch
from hyla.models.hybrid import HybridModel


class SequenceRunner:
    """Feed chunks of tokens to `num_seqs` sequences (ids 0..N-1) and get their logits. `poison`:
    caches start NaN so a read of an unwritten entry shows; `seed` shuffles blocks and slots."""

    def __init__(
        self,
        model: HybridModel,
        num_seqs: int,
        max_len: int,
        block_size: int = 16,
        poison: bool = True,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.block_size = block_size
        device = next(model.parameters()).device
        self.device = device
        per_seq = (max_len + block_size - 1) // block_size
        num_blocks = num_seqs * per_seq + 1
        rng = random.Random(seed)
        blocks = list(range(1, num_blocks))
        rng.shuffle(blocks)
        self.block_tables = [blocks[i * per_seq : (i + 1) * per_seq] for i in range(num_seqs)]
        self.state_slots = list(range(num_seqs + 1))[1:]
        rng.shuffle(self.state_slots)
        self.caches = allocate_caches(model.config, num_blocks, block_size, num_seqs + 1, device)
        if poison:
            for layer in self.caches:
                for t in layer.values():
                    t.fill_(float("nan"))
        self.lens = [0] * num_seqs
        self.max_len = max_len

    @torch.no_grad()
    def step(
        self,
        chunks: dict[int, list[int]],
        all_logits: bool = False,
        embeds: dict[int, torch.Tensor] | None = None,
        mrope_positions: dict[int, torch.Tensor] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Append `chunks[seq_id]` to each listed sequence in one packed forward; `embeds`
        [q, D] and `mrope_positions` [3, q] replace its embeddings and positions. Returns float32
        logits [V] of each last token ([q, V] with `all_logits`)."""
        ids = list(chunks)
        for i in ids:
            if not chunks[i]:
                raise ValueError(f"chunks[{i}]: empty chunk")
            if self.lens[i] + len(chunks[i]) > self.max_len:
                raise ValueError(f"chunks[{i}]: sequence would exceed max_len={self.max_len}")
        batch = build_forward_batch(
            query_lens=[len(chunks[i]) for i in ids],
            context_lens=[self.lens[i] for i in ids],
            block_tables=[self.block_tables[i] for i in ids],
            state_indices=[self.state_slots[i] for i in ids],
            block_size=self.block_size,
            caches=self.caches,
            device=self.device,
        )
        input_ids = torch.tensor(
            [t for i in ids for t in chunks[i]], dtype=torch.long, device=self.device
        )
        inputs_embeds = None
        if embeds:
            inputs_embeds = self.model.embed_tokens(input_ids)
            cu = batch.cu_seqlens_host
            for n, i in enumerate(ids):
                if i in embeds:
                    inputs_embeds[cu[n] : cu[n + 1]] = embeds[i]
        positions = batch.positions
        if mrope_positions is not None:
            positions = torch.cat([mrope_positions[i] for i in ids], dim=1).to(self.device)
        hidden = self.model(input_ids, positions, batch, inputs_embeds)
        out: dict[int, torch.Tensor] = {}
        cu = batch.cu_seqlens_host
        for n, i in enumerate(ids):
            self.lens[i] += len(chunks[i])
            rows = hidden[cu[n] : cu[n + 1]] if all_logits else hidden[cu[n + 1] - 1]
            out[i] = self.model.compute_logits(rows)
        return out

    def reset(self, seq_id: int) -> None:
        self.lens[seq_id] = 0
