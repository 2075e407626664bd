"""Full-attention mixers over the paged cache: MLA (DeepSeek / Kimi-Linear) and gated GQA
(Qwen3-Next), with HF parameter names so `self_attn.*` checkpoint tensors load by prefix."""

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
    """A subset of a batch's sequences re-packed for an op call: `rows` [t] its packed token
    rows; `block_tables` [n, max_blocks], `cu_seqlens` [n + 1], `seq_lens` of the subset."""

    rows: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens: torch.Tensor
    seq_lens: list[int]


def select_sequences(batch: ForwardBatch, seq_ids: Sequence[int]) -> SeqGroup:
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
    """q_nope [T, H, Dn], q_rope [T, H, Dr] (roped), latent [T, R + Dr] (the cache row),
    q_resid [T, Rq] (the DSA indexer's query input), cos_sin ([T, Dr/2] each)."""

    q_nope: torch.Tensor
    q_rope: torch.Tensor
    latent: torch.Tensor
    q_resid: torch.Tensor | None
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None


class MLAttention(nn.Module):
    """Multi-head latent attention (kind "mla"; DeepSeek-V2 section 2.1). Cache "latent"
    [P, B, R+Dr] holds `kv_a_layernorm(c_kv) | k_rope`; without `mla.use_rope` (Kimi-Linear)
    the rope channels stay unrotated. Decode rows take the absorbed form, prefill the expanded."""

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
        num_tokens = hidden_states.shape[0]
        q_resid = None
        if self.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
            q = self.q_b_proj(q_resid)
        q = q.view(num_tokens, self.num_heads, -1)
        q_nope, q_rope = q[..., : self.qk_nope_head_dim], q[..., self.qk_nope_head_dim :]
        kv = self.kv_a_proj_with_mqa(hidden_states)
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
        """Fill `out` [T, H, Dv] rows of `seq_ids` (host lengths)."""
        latent_cache = batch.caches[self.layer_idx]["latent"]
        latent_scale = batch.caches[self.layer_idx].get("latent_scale")
        decode = [i for i in seq_ids if batch.query_lens[i] == 1]
        prefill = [i for i in seq_ids if batch.query_lens[i] > 1]
        if len(decode) == batch.num_seqs:
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
        proj = self.project(hidden_states, positions)
        cache = batch.caches[self.layer_idx]
        latent_cache = cache["latent"]
        write_paged_entries(cache, "latent", batch.slot_mapping, proj.latent)
        attn = batch.attn
        if attn.lengths_on_device and (attn.seq_lens_host is None or batch.is_pure_decode):
            num_rows = hidden_states.shape[0]
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
        """`attend_dense` for an eager step with device lengths: decode rows via `mla_paged`,
        prefill via `mla_prefill`."""
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
    """(decode, prefill) parts of `seq_ids`, None when empty; zero-token sequences in neither."""
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
    """Grouped-query attention (kind "gqa"), with Qwen3-Next's per-head q/k RMSNorm and sigmoid
    output gate; `q_proj` holds per head K query channels then K gate channels."""

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
        if attn.seq_lens_host is None:  # captured step: lengths only on the device
            out = paged_gqa_bounded(
                q, cache["k"], cache["v"], batch.block_tables, batch.cu_seqlens,
                attn.seq_lens, attn.max_seq_len, self.scale, **kv_scales,
            ).flatten(1)  # fmt: skip
        else:
            lens = attn.seq_lens if attn.lengths_on_device else attn.seq_lens_host
            out = paged_gqa(
                q, cache["k"], cache["v"], batch.block_tables, batch.cu_seqlens,
                lens, self.scale, **kv_scales,
            ).flatten(1)  # [T, H*K]  # fmt: skip
        if gate is not None:
            out = out * torch.sigmoid(gate.reshape(num_tokens, -1))
        return self.o_proj(out)
