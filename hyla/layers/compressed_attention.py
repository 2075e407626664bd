"""DeepSeek-V4's attention mixer ("swa", "csa", "hca"; transformers `DeepseekV4Attention`). The
cache holds the compressor's inputs, re-pooled each step: prefix-cacheable, O(context) a step."""

from __future__ import annotations

import torch
from torch import nn

from hyla.config import ModelConfig
from hyla.forward_batch import ForwardBatch
from hyla.layers.linear import Linear
from hyla.layers.norm import RMSNorm
from hyla.ops.kv_compress import compress_kv, compressed_indexer_topk
from hyla.ops.linear.grouped import grouped_linear
from hyla.ops.norm import rms_norm_unweighted
from hyla.ops.paged import gather_paged, write_paged_entries
from hyla.ops.rotary import apply_rope_pairs_tail, rope_cos_sin, rope_inv_freq
from hyla.ops.sink_attention import sink_window_attention


class Compressor(nn.Module):
    """Pools `ratio` tokens per entry over `width` channels (2 series with `overlap`)."""

    def __init__(self, hidden: int, dim: int, ratio: int, overlap: bool, eps: float) -> None:
        super().__init__()
        width = 2 * dim if overlap else dim
        self.ratio, self.overlap = ratio, overlap
        self.kv_proj = Linear(hidden, width, bias=False)
        self.gate_proj = Linear(hidden, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(ratio, width, dtype=torch.float32))
        self.kv_norm = RMSNorm(dim, eps)

    keep_fp32 = ("position_bias",)

    def entries(self, kv: torch.Tensor, gate: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """kv, gate [S, width] -> entries [S // m, dim], roped at each window's first position."""
        pooled = compress_kv(kv, gate, self.position_bias, self.ratio, self.overlap)
        normed = self.kv_norm(pooled.to(kv.dtype))
        starts = torch.arange(pooled.shape[0], device=kv.device) * self.ratio
        return apply_rope_pairs_tail(normed, *rotary(starts))


class Scorer(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.weights_proj = Linear(hidden, heads, bias=False)


class Indexer(Compressor):
    """CSA's lightning indexer: its own compressor at `index_head_dim`, queries from q_resid."""

    def __init__(self, config: ModelConfig) -> None:
        c = config.compressed
        super().__init__(config.hidden_size, c.index_head_dim, c.csa_ratio, True,
                         config.rms_norm_eps)  # fmt: skip
        self.num_heads, self.head_dim, self.topk = c.index_n_heads, c.index_head_dim, c.index_topk
        self.q_b_proj = Linear(c.q_lora_rank, c.index_n_heads * c.index_head_dim, bias=False)
        self.scorer = Scorer(config.hidden_size, c.index_n_heads)


class CompressorWithIndexer(Compressor):
    def __init__(self, config: ModelConfig) -> None:
        c = config.compressed
        super().__init__(config.hidden_size, c.head_dim, c.csa_ratio, True, config.rms_norm_eps)
        self.indexer = Indexer(config)


class Rotary:
    """cos/sin [T, R/2] of positions for one rope (no attention factor: V4's reference)."""

    def __init__(self, rope) -> None:
        self.inv_freq, _ = rope_inv_freq(rope)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.inv_freq.to(positions.device))


class DeepseekV4Attention(nn.Module):
    keep_fp32 = ("sinks",)

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        c, hidden, eps = config.compressed, config.hidden_size, config.rms_norm_eps
        self.layer_idx, self.kind = layer_idx, config.layer_pattern[layer_idx]
        self.c, self.eps = c, eps
        self.q_a_proj = Linear(hidden, c.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(c.q_lora_rank, eps)
        self.q_b_proj = Linear(c.q_lora_rank, c.num_heads * c.head_dim, bias=False)
        self.kv_proj = Linear(hidden, c.head_dim, bias=False)
        self.kv_norm = RMSNorm(c.head_dim, eps)
        self.o_a_proj = Linear(c.num_heads * c.head_dim // c.o_groups, c.o_groups * c.o_lora_rank,
                               bias=False)  # fmt: skip
        self.o_b_proj = Linear(c.o_groups * c.o_lora_rank, hidden, bias=False)
        self.sinks = nn.Parameter(torch.zeros(c.num_heads, dtype=torch.float32))
        if self.kind == "csa":
            self.compressor = CompressorWithIndexer(config)
        elif self.kind == "hca":
            self.compressor = Compressor(hidden, c.head_dim, c.hca_ratio, False, eps)
        rope = config.rope if self.kind == "swa" else c.compress_rope(config.rope)
        self.rotary = Rotary(rope)
        self.scale = c.head_dim**-0.5

    def forward(
        self, hidden_states: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        c, num_tokens = self.c, hidden_states.shape[0]
        cos, sin = self.rotary(positions)
        q_resid = self.q_a_norm(self.q_a_proj(hidden_states))
        q = self.q_b_proj(q_resid).view(num_tokens, c.num_heads, c.head_dim)
        q = apply_rope_pairs_tail(rms_norm_unweighted(q, self.eps), cos, sin)
        kv = apply_rope_pairs_tail(self.kv_norm(self.kv_proj(hidden_states)), cos, sin)
        self._write(batch, hidden_states, kv)
        out = hidden_states.new_empty(num_tokens, c.num_heads, c.head_dim)
        cu = batch.cu_seqlens_host
        for i, length in enumerate(batch.seq_lens):
            rows = slice(cu[i], cu[i + 1])
            if rows.start == rows.stop:
                continue
            out[rows] = self._attend(i, length, q[rows], q_resid[rows], hidden_states[rows],
                                     positions[rows], batch)  # fmt: skip
        out = apply_rope_pairs_tail(out, cos, -sin)  # undo the values' rotation
        grouped = grouped_linear(out.reshape(num_tokens, c.o_groups, -1), self.o_a_proj.weight)
        return self.o_b_proj(grouped.flatten(1))

    def _write(self, batch: ForwardBatch, x: torch.Tensor, kv: torch.Tensor) -> None:
        cache, slots = batch.caches[self.layer_idx], batch.slot_mapping
        write_paged_entries(cache, "kv", slots, kv)
        if self.kind == "swa":
            return
        comp = self.compressor
        write_paged_entries(cache, "compress_kv", slots, comp.kv_proj(x))
        write_paged_entries(cache, "compress_gate", slots, comp.gate_proj(x))
        if self.kind == "csa":
            write_paged_entries(cache, "index_kv", slots, comp.indexer.kv_proj(x))
            write_paged_entries(cache, "index_gate", slots, comp.indexer.gate_proj(x))

    def _attend(self, i: int, length: int, q, q_resid, x, positions, batch) -> torch.Tensor:
        cache, table = batch.caches[self.layer_idx], batch.block_tables[i]

        def read(name: str) -> torch.Tensor:
            return gather_paged(cache[name], table, length, cache.get(f"{name}_scale"))

        kv, entries, selected, ratio = read("kv"), None, None, 1
        if self.kind != "swa":
            comp = self.compressor
            ratio = comp.ratio
            entries = comp.entries(read("compress_kv"), read("compress_gate"), self.rotary)
        if self.kind == "csa":
            idx = comp.indexer
            keys = idx.entries(read("index_kv"), read("index_gate"), self.rotary)
            iq = idx.q_b_proj(q_resid).view(-1, idx.num_heads, idx.head_dim)
            iq = apply_rope_pairs_tail(iq, *self.rotary(positions))
            weights = idx.scorer.weights_proj(x).float() * idx.num_heads**-0.5
            selected = compressed_indexer_topk(iq, weights, keys, positions, ratio, idx.topk,
                                               idx.head_dim**-0.5)  # fmt: skip
        out = sink_window_attention(q, kv, entries, positions, self.sinks, self.scale,
                                    self.c.sliding_window, ratio, selected)  # fmt: skip
        return out.to(q.dtype)
