"""GLM-5.3-Flash's DSA mixer (`dsa.index_kpool` > 0; transformers `Glm5NextTextAttention`):
MLA over the selected pools plus the tail, distinct and visible by construction (no sort)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hyla.config import ModelConfig
from hyla.forward_batch import ForwardBatch
from hyla.layers.attention import MLAttention
from hyla.layers.sparse_attention import LightningIndexer
from hyla.ops.dsa_indexer.rows import row_positions
from hyla.ops.kpool_indexer import kpool_indexer_topk, write_pool_keys
from hyla.ops.paged import write_paged
from hyla.ops.sparse_attention import sparse_mla

SELECTION_KEY = "kpool_selection"


class KPoolIndexer(LightningIndexer):
    """The lightning indexer plus the pool compression's gate and position offsets (`ape`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        dsa = config.dsa
        self.index_kpool_compress_ape = nn.Parameter(
            torch.zeros(dsa.index_kpool, dsa.index_head_dim)
        )
        self.index_kpool_compress_gate = nn.Parameter(
            torch.ones(dsa.index_head_dim, config.hidden_size)
        )

    def gate_scores(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, self.index_kpool_compress_gate)


class PooledDSAttention(MLAttention):
    """MLA + pooled indexer (or a shared selection) + safe sparse attention.
    Raises ValueError when `mla.q_lora_rank` is None."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        dsa = config.dsa
        if config.mla.q_lora_rank is None:
            raise ValueError("dsa: mla.q_lora_rank is required (the indexer reads q_a_layernorm)")
        self.is_shared = dsa.is_shared(layer_idx)
        self.indexer = None if self.is_shared else KPoolIndexer(config)
        self.index_topk, self.kpool = dsa.index_topk, dsa.index_kpool
        self.always_select_tail = dsa.index_kpool_always_select_tail

    def forward(
        self, hidden_states: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        proj = self.project(hidden_states, positions)
        cache = batch.caches[self.layer_idx]
        write_paged(cache["latent"], batch.slot_mapping, proj.latent)
        if self.is_shared:
            if SELECTION_KEY not in batch.per_pass:
                raise RuntimeError(f"layer {self.layer_idx}: shared DSA layer before a full one")
            selected = batch.per_pass[SELECTION_KEY]
        else:
            selected = self.select(hidden_states, proj.q_resid, batch)
            batch.per_pass[SELECTION_KEY] = selected
        out = sparse_mla(
            proj.q_nope, proj.q_rope, cache["latent"], batch.block_tables, batch.cu_seqlens,
            selected, self.kv_b_proj.weight, self.scale, seq_lens=batch.seq_lens_tensor,
            valid_selection=True,
        )  # fmt: skip
        return self.o_proj(out.flatten(1))

    def select(
        self, hidden_states: torch.Tensor, q_resid: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """Write this step's indexer entries and pool keys, then select: [T, topk (+ P - 1)]."""
        cache, indexer = batch.caches[self.layer_idx], self.indexer
        num_rows = hidden_states.shape[0]
        rows = batch.shared(("row_positions", num_rows), lambda: row_positions(
            batch.cu_seqlens, batch.seq_lens_tensor, num_rows))  # fmt: skip
        q, weights, keys = indexer(hidden_states, q_resid, None)
        write_paged(cache["index_keys"], batch.slot_mapping, keys)
        write_paged(cache["index_gates"], batch.slot_mapping, indexer.gate_scores(hidden_states))
        write_pool_keys(
            cache["index_keys"], cache["index_gates"], cache["index_pool_keys"],
            indexer.index_kpool_compress_ape, batch.block_tables, batch.cu_seqlens,
            batch.seq_lens_tensor, batch.slot_mapping, rows,
        )  # fmt: skip
        return kpool_indexer_topk(
            q, weights, cache["index_pool_keys"], batch.block_tables, batch.cu_seqlens,
            batch.seq_lens_tensor, batch.max_seq_len, self.index_topk, self.kpool,
            self.always_select_tail, indexer.softmax_scale, static_shapes=batch.attn.graph_kernels,
            rows=rows,
        )  # fmt: skip
