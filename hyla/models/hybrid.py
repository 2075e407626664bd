"""The hybrid decoder: embedding, one pre-norm (mixer, FFN) pair per layer, final norm; classes
come from `MIXERS` / `FFNS` only; `hc_mult` > 1: N residual streams [T, N, D]."""

from __future__ import annotations

import importlib

import torch
from torch import nn

from hyla.config import ModelConfig
from hyla.forward_batch import ForwardBatch
from hyla.layers.hyper_connection import HyperConnection, HyperHead
from hyla.layers.linear import Linear
from hyla.layers.norm import RMSNorm
from hyla.ops.linear import adjacent_rows, stack_rows

# kind -> "module:Class"; imported lazily so a pattern only loads what it uses.
MIXERS = {
    "kda": "hyla.layers.linear_attention:KimiDeltaAttention",
    "gdn": "hyla.layers.linear_attention:GatedDeltaNet",
    "mla": "hyla.layers.attention:MLAttention",
    "gqa": "hyla.layers.attention:GQAttention",
    "dsa": "hyla.layers.sparse_attention:DSAttention",
    "dsa_kpool": "hyla.layers.pooled_sparse_attention:PooledDSAttention",
    "swa": "hyla.layers.compressed_attention:DeepseekV4Attention",
    "csa": "hyla.layers.compressed_attention:DeepseekV4Attention",
    "hca": "hyla.layers.compressed_attention:DeepseekV4Attention",
}
FFNS = {
    "dense": "hyla.layers.mlp:GatedMLP",
    "moe": "hyla.layers.moe:MoE",
    "hash_moe": "hyla.layers.moe:MoE",
}
INPUT_IDS = "input_ids"  # batch.per_pass: the pass's token ids (hash-routed MoE layers)


def _resolve(path: str) -> type[nn.Module]:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _mixer_key(config: ModelConfig, layer_idx: int) -> str:
    kind = config.layer_pattern[layer_idx]
    return "dsa_kpool" if kind == "dsa" and config.dsa.index_kpool else kind


class DecoderLayer(nn.Module):
    """One pre-norm block: h += mixer(input_layernorm(h)); h += mlp(post_attention_layernorm(h))."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        eps, offset = config.rms_norm_eps, config.norm_offset
        self.input_layernorm = RMSNorm(config.hidden_size, eps, offset)
        self.mixer = _resolve(MIXERS[_mixer_key(config, layer_idx)])(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, offset)
        self.mlp = _resolve(FFNS[config.ffn_pattern[layer_idx]])(config, layer_idx)
        if config.hc_mult > 1:
            self.attn_hc = HyperConnection(config)
            self.ffn_hc = HyperConnection(config)

    def forward(
        self,
        delta: torch.Tensor | None,
        residual: torch.Tensor,
        positions: torch.Tensor,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each residual add fused into the next norm (vLLM's convention, same numbers): input
        `residual + delta` (delta None: `residual`) -> (mlp output, residual), all [T, D]."""
        if delta is None:
            x = self.input_layernorm(residual)
        else:
            x, residual = self.input_layernorm.add_and_norm(delta, residual)
        x, residual = self.post_attention_layernorm.add_and_norm(
            self.mixer(x, positions, batch), residual
        )
        return self._ffn(x, batch), residual

    def forward_streams(
        self, streams: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """The block with hyper-connections: streams [T, N, D] -> [T, N, D]."""
        x, post, comb = self.attn_hc.pre_norm(streams, self.input_layernorm)
        out = self.mixer(x, positions, batch)
        streams = self.attn_hc.expand(out, streams, post, comb)
        x, post, comb = self.ffn_hc.pre_norm(streams, self.post_attention_layernorm)
        out = self._ffn(x, batch)
        return self.ffn_hc.expand(out, streams, post, comb)

    def _ffn(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        if getattr(self.mlp, "routes_by_token", False):
            return self.mlp(x, batch.per_pass[INPUT_IDS])
        return self.mlp(x)


class HybridModel(nn.Module):
    """A causal LM over a hybrid layer pattern, on a packed varlen batch."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        if config.hc_head_weighted:
            self.hc_head = HyperHead(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: ForwardBatch,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] int64 -> final-normed hidden [T, D]; layers update
        `batch.caches` in place; `inputs_embeds` [T, D] replaces the token embeddings."""
        batch.per_pass.clear()  # a new pass: nothing computed for an earlier one is reused
        batch.per_pass[INPUT_IDS] = input_ids
        embeds = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if self.config.hc_mult > 1:
            return self._forward_streams(embeds, positions, batch)
        delta, residual = None, embeds
        for layer in self.layers:
            delta, residual = layer(delta, residual, positions, batch)
        if delta is None:
            return self.norm(residual)
        return self.norm.add_and_norm(delta, residual)[0]

    def _forward_streams(
        self, embeds: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        # [T, D] -> N equal streams [T, N, D]
        streams = embeds[:, None, :].expand(-1, self.config.hc_mult, -1).contiguous()
        for layer in self.layers:
            streams = layer.forward_streams(streams, positions, batch)
        if self.config.hc_head_weighted:
            return self.norm(self.hc_head(streams))
        return self.norm(streams.mean(dim=1))

    @torch.no_grad()
    def stack_projections(self) -> None:
        """Store each group of projections reading one input (`stacked_projections()`, KDA's
        `stacked_convolutions()`) as row blocks of one tensor (one matmul; same state dict)."""
        for module in self.modules():
            for name in ("stacked_projections", "stacked_convolutions"):
                group = getattr(module, name, None)
                if group is not None:
                    stack_group(group())

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [n, D] -> logits [n, V] float32."""
        return self.lm_head(hidden_states).float()


def stack_group(modules: tuple[nn.Module, ...]) -> None:
    """Re-home `modules`' weights as row blocks of one tensor unless they already are."""
    weights = [m.weight.flatten(1) for m in modules]
    if adjacent_rows(weights) is None:
        stack_rows(modules)
