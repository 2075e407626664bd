"""Tensor-parallel layers (`hyla.distributed`), with the single-device modules' parameter
names: vocab rows [r * Vp, (r + 1) * Vp), Vp = ceil(V / N), and E / N whole experts per rank."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hyla.distributed.groups import TPGroup
from hyla.layers.fp8_experts import Fp8Experts
from hyla.ops.linear import Prepacked
from hyla.ops.moe import moe_experts


class VocabParallelEmbedding(nn.Module):
    """This rank's rows `weight [Vp, D]` of the embedding table (zero padded)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.rows = -(-vocab_size // tp.world_size)
        self.first = tp.rank * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = self.tp.broadcast_(input_ids) - self.first
        outside = (ids < 0) | (ids >= self.rows)
        out = F.embedding(ids.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(nn.Module):
    """This rank's rows of the output head; logits all-gathered into [n, V]."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(-(-vocab_size // tp.world_size), hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        local = F.linear(hidden_states, self.weight)
        return self.tp.all_gather_last(local)[..., : self.vocab_size]


class ExpertParallelExperts(nn.Module):
    """Experts [first, first + E_local) of E, in `hyla.layers.moe.Experts`' layout."""

    def __init__(self, hidden_size: int, intermediate: int, num_local: int, first: int) -> None:
        super().__init__()
        self.first, self.num_local = first, num_local
        self.gate_up_proj = nn.Parameter(torch.empty(num_local, 2 * intermediate, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_local, hidden_size, intermediate))
        self.packed = (Prepacked(), Prepacked())

    def local_routing(
        self, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, local ids) of global routing [T, k]; another rank's pairs go to local
        expert 0 with weight 0 (exact)."""
        local = topk_ids - self.first
        outside = (local < 0) | (local >= self.num_local)
        return topk_weights.masked_fill(outside, 0), local.masked_fill(outside, 0)

    def forward(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        local = topk_ids - self.first
        outside = (local < 0) | (local >= self.num_local)
        if not hidden_states.is_cuda:
            token, slot = (~outside).nonzero(as_tuple=True)
            y = moe_experts(
                hidden_states.index_select(0, token), self.gate_up_proj, self.down_proj,
                topk_weights[token, slot][:, None], local[token, slot][:, None],
                packed=self.packed,
            )  # fmt: skip
            return torch.zeros_like(hidden_states).index_add_(0, token, y)
        # no host sync (graphs): pairs routed elsewhere run on local expert 0 with weight 0
        weights = topk_weights.masked_fill(outside, 0)
        return moe_experts(
            hidden_states, self.gate_up_proj, self.down_proj, weights,
            local.masked_fill(outside, 0), packed=self.packed,
        )  # fmt: skip


class Fp8ExpertParallelExperts(Fp8Experts):
    """`ExpertParallelExperts` with block-scaled fp8 weights."""

    def __init__(
        self, hidden_size: int, intermediate: int, num_local: int, first: int,
        block_size: tuple[int, int], device: torch.device | str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(num_local, hidden_size, intermediate, block_size, device)
        self.first, self.num_local = first, num_local

    local_routing = ExpertParallelExperts.local_routing

    def forward(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return super().forward(hidden_states, *self.local_routing(topk_weights, topk_ids))
