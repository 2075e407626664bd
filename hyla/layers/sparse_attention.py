"""DeepSeek Sparse Attention mixer (kind "dsa"; HF `DeepseekV32Attention`): MLA over the
`dsa.index_topk` tokens a lightning indexer selects. GLM-5's "shared" layers have no indexer
and reuse the last full layer's top-k of the same pass (`batch.per_pass`)."""

from __future__ import annotations

import torch
from torch import nn

from hyla.config import ModelConfig
from hyla.forward_batch import ForwardBatch, index_tensor
from hyla.layers.attention import MLAProjection, MLAttention, SeqGroup, select_sequences
from hyla.layers.linear import Linear
from hyla.ops.dsa_indexer import lightning_indexer_topk
from hyla.ops.dsa_indexer.rows import dense_topk_indices
from hyla.ops.paged import write_paged_entries
from hyla.ops.rotary import apply_rope
from hyla.ops.sparse_attention import sparse_mla

SELECTION_KEY = "dsa_selection"
INDEX_KEY_NORM_EPS = 1e-6  # HF `DeepseekV32Indexer`'s k_norm LayerNorm


class LightningIndexer(nn.Module):
    """The DSA indexer's projections; rope in `dsa.index_rope_style` ("neox" for DeepSeek-V3.2,
    unlike its MLA's interleaved rope) with the MLA layer's cos/sin."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dsa, mla = config.dsa, config.mla
        self.n_heads, self.head_dim = dsa.index_n_heads, dsa.index_head_dim
        self.wq_b = Linear(mla.q_lora_rank, dsa.index_n_heads * dsa.index_head_dim, bias=False)
        self.wk = Linear(config.hidden_size, dsa.index_head_dim, bias=False)
        self.k_norm = nn.LayerNorm(dsa.index_head_dim, eps=INDEX_KEY_NORM_EPS)
        self.weights_proj = Linear(config.hidden_size, dsa.index_n_heads, bias=False)
        self.softmax_scale = dsa.index_head_dim**-0.5
        self.rope_style = dsa.index_rope_style

    def forward(
        self,
        hidden_states: torch.Tensor,
        q_resid: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden_states [T, D], q_resid [T, Rq] -> (q [T, Hi, Di], weights [T, Hi], k [T, Di])."""
        num_tokens = hidden_states.shape[0]
        q = self.wq_b(q_resid).view(num_tokens, self.n_heads, self.head_dim)
        k = self.k_norm(self.wk(hidden_states))[:, None, :]
        if cos_sin is not None:
            q = apply_rope(q, *cos_sin, style=self.rope_style)
            k = apply_rope(k, *cos_sin, style=self.rope_style)
        weights = self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype)).float()
        return q, weights, k[:, 0]


class DSAttention(MLAttention):
    """MLA + lightning indexer + top-k sparse attention. A sequence no longer than `index_topk`
    takes MLA's dense path (the indexer would select every token: same result).
    Raises ValueError when `mla.q_lora_rank` is None."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        if config.mla.q_lora_rank is None:
            raise ValueError("dsa: mla.q_lora_rank is required (the indexer reads q_a_layernorm)")
        self.is_shared = config.dsa.is_shared(layer_idx)
        self.indexer = None if self.is_shared else LightningIndexer(config)
        self.index_topk = config.dsa.index_topk

    def forward(
        self, hidden_states: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        proj = self.project(hidden_states, positions)
        cache = batch.caches[self.layer_idx]
        write_paged_entries(cache, "latent", batch.slot_mapping, proj.latent)
        index_q = index_w = None
        if self.indexer is not None:
            index_q, index_w, index_k = self.indexer(hidden_states, proj.q_resid, proj.cos_sin)
            write_paged_entries(cache, "index_keys", batch.slot_mapping, index_k)
        if batch.attn.lengths_on_device:
            return self.o_proj(self.attend_on_device(proj, index_q, index_w, batch).flatten(1))
        seq_lens = batch.seq_lens
        dense = [i for i in range(batch.num_seqs) if seq_lens[i] <= self.index_topk]
        sparse = [i for i in range(batch.num_seqs) if seq_lens[i] > self.index_topk]
        out = hidden_states.new_empty(hidden_states.shape[0], self.num_heads, self.v_head_dim)
        self.attend_dense(out, proj, batch, dense)
        if sparse:
            self.attend_sparse(out, proj, index_q, index_w, batch, sparse)
        return self.o_proj(out.flatten(1))

    def attend_on_device(
        self,
        proj: MLAProjection,
        index_q: torch.Tensor,
        index_w: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Attention [T, H, Dv] with device lengths; short prefills of an eager step take
        `attend_split`, every other row one `attend_selected` call."""
        dense = batch.shared(("dsa_dense_prefill", self.index_topk), lambda: _dense_prefill(
            batch, self.index_topk))  # fmt: skip
        if not dense:
            return self.attend_selected(proj, index_q, index_w, batch)
        out = proj.q_nope.new_empty(proj.q_nope.shape[0], self.num_heads, self.v_head_dim)
        self.attend_split(out, proj, batch, dense)
        rest = batch.shared(("dsa_rest", self.index_topk), lambda: _rest_group(batch, dense))
        if rest is not None:
            g, lens = rest
            out[g.rows] = self.attend_selected(
                proj, index_q, index_w, batch, group=(g.rows, g.block_tables, g.cu_seqlens, lens,
                                                      max(g.seq_lens)),
            )  # fmt: skip
        return out

    def attend_selected(
        self,
        proj: MLAProjection,
        index_q: torch.Tensor,
        index_w: torch.Tensor,
        batch: ForwardBatch,
        group: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None,
    ) -> torch.Tensor:
        """Attention [T, H, Dv] of every row (or of `group`'s: rows, block_tables, cu_seqlens,
        seq_lens, max_seq_len) in one `sparse_mla` call; max_seq_len <= k skips the indexer."""
        cache = batch.caches[self.layer_idx]
        k = self.index_topk
        q_nope, q_rope = proj.q_nope, proj.q_rope
        tables, cu, lens, max_len = (
            batch.block_tables, batch.cu_seqlens, batch.seq_lens_tensor, batch.max_seq_len
        )  # fmt: skip
        if group is not None:
            rows, tables, cu, lens, max_len = group
            q_nope, q_rope = q_nope[rows], q_rope[rows]
        num_rows = q_nope.shape[0]
        if max_len <= k:
            topk_indices = batch.shared(("dense_topk", k, num_rows, group is None), lambda:
                dense_topk_indices(cu, lens, k, num_rows))  # fmt: skip
        else:
            topk_indices = self.selection(batch, ("selected", group is None), lambda: (
                lightning_indexer_topk(
                    index_q if group is None else index_q[group[0]],
                    index_w if group is None else index_w[group[0]],
                    cache["index_keys"], tables, cu, lens, k, self.indexer.softmax_scale,
                    cache.get("index_keys_scale"), max_seq_len=max_len,
                    static_shapes=batch.attn.graph_kernels,
                )))  # fmt: skip
        return sparse_mla(
            q_nope, q_rope, cache["latent"], tables, cu, topk_indices, self.kv_b_proj.weight,
            self.scale, latent_scale=cache.get("latent_scale"),
        )  # fmt: skip

    def attend_sparse(
        self,
        out: torch.Tensor,
        proj: MLAProjection,
        index_q: torch.Tensor,
        index_w: torch.Tensor,
        batch: ForwardBatch,
        seq_ids: list[int],
    ) -> None:
        cache = batch.caches[self.layer_idx]
        g = select_sequences(batch, seq_ids)
        topk_indices = self.selection(batch, ("sparse",), lambda: lightning_indexer_topk(
            index_q[g.rows], index_w[g.rows], cache["index_keys"], g.block_tables, g.cu_seqlens,
            g.seq_lens, self.index_topk, self.indexer.softmax_scale,
            cache.get("index_keys_scale"),
        ))  # fmt: skip
        out[g.rows] = sparse_mla(
            proj.q_nope[g.rows],
            proj.q_rope[g.rows],
            cache["latent"],
            g.block_tables,
            g.cu_seqlens,
            topk_indices,
            self.kv_b_proj.weight,
            self.scale,
            latent_scale=cache.get("latent_scale"),
        )

    def selection(self, batch: ForwardBatch, key: tuple, compute) -> torch.Tensor:
        """Top-k of the rows `key` names, computed by a full layer, reused by shared ones (every
        layer of a pass splits the batch alike). Raises RuntimeError if no full layer ran."""
        key = (SELECTION_KEY, *key)
        if not self.is_shared:
            batch.per_pass[key] = compute()
        elif key not in batch.per_pass:
            raise RuntimeError(f"layer {self.layer_idx}: shared DSA layer before a full one")
        return batch.per_pass[key]


def _dense_prefill(batch: ForwardBatch, topk: int) -> list[int]:
    if batch.attn.seq_lens_host is None:
        return []
    lens, query_lens = batch.attn.seq_lens_host, batch.query_lens
    return [i for i, n in enumerate(lens) if query_lens[i] > 1 and n <= topk]


def _rest_group(batch: ForwardBatch, dense: list[int]) -> tuple[SeqGroup, torch.Tensor] | None:
    skip = set(dense)
    rest = [i for i in range(batch.num_seqs) if i not in skip and batch.query_lens[i] > 0]
    if not rest:
        return None
    g = select_sequences(batch, rest)
    return g, index_tensor(g.seq_lens, g.cu_seqlens.device, torch.int32)
