"""Full-attention mixers over the paged cache: MLA (DeepSeek / Kimi-Linear) and gated GQA
(Qwen3-Next).

Parameter names and shapes follow the Hugging Face modules (`KimiLinearAttention`,
`DeepseekV32Attention`, `Qwen3NextAttention`), so a checkpoint's `self_attn.*` tensors load by
prefix. Each mixer writes this step's tokens to `batch.caches[layer_idx]` at `batch.slot_mapping`
first, then reads every sequence's whole context through its block table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hyla.config import ModelConfig
from hyla.forward_batch import ForwardBatch, index_tensor
from hyla.layers.linear import Linear
from hyla.layers.norm import RMSNorm
from hyla.layers.rotary import RotaryEmbedding
from hyla.ops.dsa_indexer.rows import row_positions
from hyla.ops.gqa import paged_gqa, paged_gqa_bounded
from hyla.ops.mla import mla_absorbed_batched, mla_expanded, mla_paged, mla_prefill
from hyla.ops.paged import write_paged_entries
from hyla.ops.rotary import rope_softmax_mscale


@dataclass
class SeqGroup:
    """A subset of a batch's sequences, re-packed for an op call.

    `rows` [t] int64 are the packed token rows of the subset (in sequence order);
    `block_tables` [n, max_blocks], `cu_seqlens` [n + 1] int32 and `seq_lens` (n host ints)
    describe the subset alone.
    """

    rows: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens: torch.Tensor
    seq_lens: list[int]


def select_sequences(batch: ForwardBatch, seq_ids: Sequence[int]) -> SeqGroup:
    """The rows, block tables and offsets of sequences `seq_ids` of `batch`."""
    cu = batch.cu_seqlens_host  # host ints: no device sync
    device = batch.cu_seqlens.device
    rows = [r for i in seq_ids for r in range(cu[i], cu[i + 1])]
    sub_cu = [0]
    for i in seq_ids:
        sub_cu.append(sub_cu[-1] + cu[i + 1] - cu[i])
    seq_lens = batch.seq_lens
    return SeqGroup(
        rows=index_tensor(rows, device),
        block_tables=batch.block_tables[index_tensor(list(seq_ids), device)],
        cu_seqlens=index_tensor(sub_cu, device, torch.int32),
        seq_lens=[seq_lens[i] for i in seq_ids],
    )


@dataclass
class MLAProjection:
    """An MLA layer's per-token projections: `q_nope` [T, H, Dn], `q_rope` [T, H, Dr] (roped),
    `latent` [T, R + Dr] (the cache row), `q_resid` [T, Rq] (`q_a_layernorm` output, the DSA
    indexer's query input; None without q_lora_rank), `cos_sin` ([T, Dr/2] each; None without
    rope)."""

    q_nope: torch.Tensor
    q_rope: torch.Tensor
    latent: torch.Tensor
    q_resid: torch.Tensor | None
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None


class MLAttention(nn.Module):
    """Multi-head latent attention (kind "mla"; DeepSeek-V2 section 2.1).

    Parameters (HF names): `q_proj` [H*(Dn+Dr), D] when `mla.q_lora_rank` is None, else
    `q_a_proj` [Rq, D], `q_a_layernorm` [Rq], `q_b_proj` [H*(Dn+Dr), Rq]; `kv_a_proj_with_mqa`
    [R+Dr, D], `kv_a_layernorm` [R], `kv_b_proj` [H*(Dn+Dv), R], `o_proj` [D, H*Dv].

    Cache "latent" [P, B, R+Dr] holds `kv_a_layernorm(c_kv) | k_rope` per token. With
    `mla.use_rope` the rope channels rotate (style from `config.rope`, "interleave" for DeepSeek)
    and the softmax scale includes YaRN's mscale^2; without (Kimi-Linear) they stay unrotated and
    the scale is `(Dn+Dr)^-0.5`. On the CPU, prefill sequences use the expanded form, decode
    sequences (one new token) the absorbed one, all of them in one batched call. When the step's
    lengths are read on the device (`batch.attn.lengths_on_device`: on CUDA, and in a captured
    step), a captured or pure-decode step sends every row to `mla_paged` (absorbed, Triton on
    CUDA); an eager step with prefill sequences sends those to `mla_prefill` (expanded, the tiled
    FlashAttention-style kernel) and its decode rows to `mla_paged` (`attend_split`).
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        mla = config.mla
        self.layer_idx = layer_idx
        self.num_heads = mla.num_heads
        self.qk_nope_head_dim = mla.qk_nope_head_dim
        self.qk_rope_head_dim = mla.qk_rope_head_dim
        self.kv_lora_rank = mla.kv_lora_rank
        self.v_head_dim = mla.v_head_dim
        self.q_lora_rank = mla.q_lora_rank
        hidden, heads = config.hidden_size, mla.num_heads
        eps, offset = mla.norm_eps, config.norm_offset
        if mla.q_lora_rank is None:
            self.q_proj = Linear(hidden, heads * mla.qk_head_dim, bias=False)
        else:
            self.q_a_proj = Linear(hidden, mla.q_lora_rank, bias=mla.bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, eps, offset)
            self.q_b_proj = Linear(mla.q_lora_rank, heads * mla.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(hidden, mla.latent_dim, bias=mla.bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, eps, offset)
        self.kv_b_proj = Linear(
            mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False
        )
        self.o_proj = Linear(heads * mla.v_head_dim, hidden, bias=mla.bias)
        self.rotary: RotaryEmbedding | None = None
        self.scale = mla.qk_head_dim**-0.5
        if mla.use_rope:
            if config.rope.rotary_dim != mla.qk_rope_head_dim:
                raise ValueError(
                    f"rope.rotary_dim={config.rope.rotary_dim} must equal "
                    f"mla.qk_rope_head_dim={mla.qk_rope_head_dim}"
                )
            self.rotary = RotaryEmbedding(config.rope)
            self.scale *= rope_softmax_mscale(config.rope)

    def project(self, hidden_states: torch.Tensor, positions: torch.Tensor) -> MLAProjection:
        """Queries and cache latents of the new tokens (hidden_states [T, D], positions [T])."""
        num_tokens = hidden_states.shape[0]
        q_resid = None
        if self.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
            q = self.q_b_proj(q_resid)
        q = q.view(num_tokens, self.num_heads, -1)  # [T, H, Dn + Dr]
        q_nope, q_rope = q[..., : self.qk_nope_head_dim], q[..., self.qk_nope_head_dim :]
        kv = self.kv_a_proj_with_mqa(hidden_states)  # [T, R + Dr]
        c_kv = self.kv_a_layernorm(kv[:, : self.kv_lora_rank])
        k_rope = kv[:, self.kv_lora_rank :]
        cos_sin = None
        if self.rotary is not None:
            cos_sin = self.rotary(positions)
            q_rope = self.rotary.rotate(q_rope, *cos_sin)
            k_rope = self.rotary.rotate(k_rope[:, None, :], *cos_sin)[:, 0]
        latent = torch.cat([c_kv, k_rope], dim=-1)
        return MLAProjection(q_nope, q_rope, latent, q_resid, cos_sin)

    def attend_dense(
        self, out: torch.Tensor, proj: MLAProjection, batch: ForwardBatch, seq_ids: Sequence[int]
    ) -> None:
        """Fill `out` [T, H, Dv] rows of `seq_ids` with causal MLA over their whole context:
        absorbed for one-token (decode) sequences, expanded otherwise."""
        latent_cache = batch.caches[self.layer_idx]["latent"]
        latent_scale = batch.caches[self.layer_idx].get("latent_scale")
        decode = [i for i in seq_ids if batch.query_lens[i] == 1]
        prefill = [i for i in seq_ids if batch.query_lens[i] > 1]
        if len(decode) == batch.num_seqs:  # a pure decode step: the batch as it is
            out[:] = mla_absorbed_batched(
                proj.q_nope,
                proj.q_rope,
                latent_cache,
                batch.block_tables,
                batch.cu_seqlens,
                batch.seq_lens,
                self.kv_b_proj.weight,
                self.scale,
                query_lens=batch.query_lens,
                latent_scale=latent_scale,
            )
            return
        for ids, op in ((decode, mla_absorbed_batched), (prefill, mla_expanded)):
            if not ids:
                continue
            g = select_sequences(batch, ids)
            out[g.rows] = op(
                proj.q_nope[g.rows],
                proj.q_rope[g.rows],
                latent_cache,
                g.block_tables,
                g.cu_seqlens,
                g.seq_lens,
                self.kv_b_proj.weight,
                self.scale,
                latent_scale=latent_scale,
            )

    def forward(
        self, hidden_states: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """hidden_states [T, D], positions [T] int64 -> [T, D]."""
        proj = self.project(hidden_states, positions)
        cache = batch.caches[self.layer_idx]
        latent_cache = cache["latent"]
        write_paged_entries(cache, "latent", batch.slot_mapping, proj.latent)
        attn = batch.attn
        if attn.lengths_on_device and (attn.seq_lens_host is None or batch.is_pure_decode):
            num_rows = hidden_states.shape[0]  # one call over all rows (captured decode too)
            rows = batch.shared(("row_positions", num_rows), lambda: row_positions(
                batch.cu_seqlens, batch.seq_lens_tensor, num_rows))  # fmt: skip
            out = mla_paged(
                proj.q_nope, proj.q_rope, latent_cache, batch.block_tables, batch.cu_seqlens,
                batch.seq_lens_tensor, batch.max_seq_len, self.kv_b_proj.weight, self.scale,
                rows=rows, latent_scale=cache.get("latent_scale"),
            )  # fmt: skip
            return self.o_proj(out.flatten(1))
        out = hidden_states.new_empty(hidden_states.shape[0], self.num_heads, self.v_head_dim)
        attend = self.attend_split if attn.lengths_on_device else self.attend_dense
        attend(out, proj, batch, range(batch.num_seqs))
        return self.o_proj(out.flatten(1))

    def attend_split(
        self, out: torch.Tensor, proj: MLAProjection, batch: ForwardBatch, seq_ids: Sequence[int]
    ) -> None:
        """Fill `out` [T, H, Dv] rows of `seq_ids` on a step with host and device lengths (an
        eager CUDA step): decode sequences (one new token) through `mla_paged` (absorbed, as a
        captured decode step), prefill sequences through `mla_prefill` (expanded, tiled)."""
        cache = batch.caches[self.layer_idx]
        latent_scale = cache.get("latent_scale")
        decode, prefill = batch.shared(("mla_split", tuple(seq_ids)), lambda: split_by_query_len(
            batch, seq_ids))  # fmt: skip
        weight = self.kv_b_proj.weight
        if decode is not None:
            g, lens, rows = decode
            out[g.rows] = mla_paged(
                proj.q_nope[g.rows], proj.q_rope[g.rows], cache["latent"], g.block_tables,
                g.cu_seqlens, lens, max(g.seq_lens), weight, self.scale, rows=rows,
                latent_scale=latent_scale,
            )  # fmt: skip
        if prefill is not None:
            g, query_lens = prefill
            out[g.rows] = mla_prefill(
                proj.q_nope[g.rows], proj.q_rope[g.rows], cache["latent"], g.block_tables,
                g.cu_seqlens, g.seq_lens, weight, self.scale, query_lens=query_lens,
                latent_scale=latent_scale,
            )  # fmt: skip


DecodePart = tuple[SeqGroup, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]
PrefillPart = tuple[SeqGroup, list[int]]


def split_by_query_len(
    batch: ForwardBatch, seq_ids: Sequence[int]
) -> tuple[DecodePart | None, PrefillPart | None]:
    """`seq_ids` split for `MLAttention.attend_split`: (decode, prefill), each None when empty;
    decode = (SeqGroup, seq_lens [n] int32 on the device, its `row_positions`), prefill =
    (SeqGroup, query_lens host ints). Sequences with no new token are in neither."""
    decode = [i for i in seq_ids if batch.query_lens[i] == 1]
    prefill = [i for i in seq_ids if batch.query_lens[i] > 1]
    decode_part: DecodePart | None = None
    prefill_part: PrefillPart | None = None
    if decode:
        g = select_sequences(batch, decode)
        lens = index_tensor(g.seq_lens, g.cu_seqlens.device, torch.int32)
        decode_part = (g, lens, row_positions(g.cu_seqlens, lens, len(decode)))
    if prefill:
        prefill_part = (select_sequences(batch, prefill), [batch.query_lens[i] for i in prefill])
    return decode_part, prefill_part


class GQAttention(nn.Module):
    """Grouped-query attention (kind "gqa"), with Qwen3-Next's per-head q/k RMSNorm
    (`gqa.qk_norm`) and sigmoid output gate (`gqa.output_gate`).

    Parameters (HF names): `q_proj` [H*K*(2 if output_gate else 1), D] (per head: K query
    channels then K gate channels), `k_proj` / `v_proj` [HKV*K, D], `o_proj` [D, H*K]; `q_norm`,
    `k_norm` [K] (zero-centred when `config.norm_offset` is 1). Rope rotates the first
    `config.rope.rotary_dim` channels of each head (partial rotary). Caches "k" / "v"
    [P, B, HKV, K] hold the normed, roped keys and the values. A step whose lengths only the
    device holds (`attn.seq_lens_host` None: a captured one) attends through
    `paged_gqa_bounded`, any other step through
    `paged_gqa` (on CUDA one FlashAttention-style Triton launch over the paged K/V; elsewhere
    the dense reference, one sequence at a time).
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        gqa = config.gqa
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            gqa.num_heads,
            gqa.num_kv_heads,
            gqa.head_dim,
        )
        self.output_gate = gqa.output_gate
        hidden, dim = config.hidden_size, gqa.head_dim
        q_out = gqa.num_heads * dim * (2 if gqa.output_gate else 1)
        self.q_proj = Linear(hidden, q_out, bias=gqa.bias)
        self.k_proj = Linear(hidden, gqa.num_kv_heads * dim, bias=gqa.bias)
        self.v_proj = Linear(hidden, gqa.num_kv_heads * dim, bias=gqa.bias)
        self.o_proj = Linear(gqa.num_heads * dim, hidden, bias=gqa.bias)
        if gqa.qk_norm:
            self.q_norm = RMSNorm(dim, config.rms_norm_eps, config.norm_offset)
            self.k_norm = RMSNorm(dim, config.rms_norm_eps, config.norm_offset)
        self.rotary = RotaryEmbedding(config.rope)
        self.scale = dim**-0.5

    def forward(
        self, hidden_states: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """hidden_states [T, D], positions [T] int64 -> [T, D]."""
        num_tokens = hidden_states.shape[0]
        q = self.q_proj(hidden_states).view(num_tokens, self.num_heads, -1)
        gate = None
        if self.output_gate:
            q, gate = q[..., : self.head_dim], q[..., self.head_dim :]
        k = self.k_proj(hidden_states).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(hidden_states).view(num_tokens, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rotary(positions)
        q, k = self.rotary.rotate(q, cos, sin), self.rotary.rotate(k, cos, sin)
        cache = batch.caches[self.layer_idx]
        write_paged_entries(cache, "k", batch.slot_mapping, k)
        write_paged_entries(cache, "v", batch.slot_mapping, v)
        kv_scales = {"k_scale": cache.get("k_scale"), "v_scale": cache.get("v_scale")}
        attn = batch.attn
        if attn.seq_lens_host is None:  # lengths only on the device, size from the bound
            out = paged_gqa_bounded(
                q, cache["k"], cache["v"], batch.block_tables, batch.cu_seqlens,
                attn.seq_lens, attn.max_seq_len, self.scale, **kv_scales,
            ).flatten(1)  # fmt: skip
        else:  # on CUDA one Triton launch, lengths from the device (`hyla.ops.gqa.kernels`)
            lens = attn.seq_lens if attn.lengths_on_device else attn.seq_lens_host
            out = paged_gqa(
                q, cache["k"], cache["v"], batch.block_tables, batch.cu_seqlens,
                lens, self.scale, **kv_scales,
            ).flatten(1)  # [T, H*K]  # fmt: skip
        if gate is not None:
            out = out * torch.sigmoid(gate.reshape(num_tokens, -1))
        return self.o_proj(out)
