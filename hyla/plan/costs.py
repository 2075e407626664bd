"""What a model costs per token and per sequence, split the way parallelism splits it.

    weights  = embedding (embed_tokens + lm_head)  + routed experts  + the rest ("dense")
    cache    = per token, per attention-like layer (mla/dsa latent, dsa index keys, gqa k/v)
    state    = per sequence, per linear layer (recurrent fp32 + conv)

Parameter counts come from a model built on the meta device (`hyla.models.inspect`), byte sizes
from `hyla.cache.spec`; FLOPs are the matmul count (2 per multiply-add) of the forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hyla.cache.spec import DTYPE_BYTES, conv_dim, kv_dtype
from hyla.config import ModelConfig
from hyla.models.loader import build_empty_model
from hyla.plan import compressed_costs as v4

LINEAR_CHUNK = 64  # tokens per chunk of the chunked delta rule (intra-chunk FLOPs)


@dataclass(frozen=True)
class ParamSplit:
    """Parameter counts: `embedding` (input table + output head; one table when tied),
    `experts` (routed experts of every MoE layer), `dense` (everything else)."""

    embedding: int
    experts: int
    dense: int
    num_moe_layers: int

    @property
    def total(self) -> int:
        return self.embedding + self.experts + self.dense


def param_split(config: ModelConfig) -> ParamSplit:
    """Split the weights of the model `config` describes: parameters and persistent buffers
    (e.g. a router's correction bias), built on the meta device (nothing allocated)."""
    model = build_empty_model(config.replace(dtype="float32"), "meta")
    embedding = experts = dense = 0
    for name, p in model.state_dict(keep_vars=True).items():
        if name.startswith(("embed_tokens.", "lm_head.")):
            embedding += p.numel()
        elif ".mlp.experts." in name:
            experts += p.numel()
        else:
            dense += p.numel()
    return ParamSplit(embedding, experts, dense, config.ffn_pattern.count("moe"))


def _heads_per_gpu(heads: int, tp: int) -> int:
    return math.ceil(heads / tp)


def cache_bytes_per_token(config: ModelConfig, tp: int = 1) -> int:
    """Paged-cache bytes one token costs on one GPU of a tensor-parallel group of `tp`.

    MLA/DSA latents and index keys are shared by all heads, so every rank holds them whole; GQA
    k/v are split by kv head (a rank holds ceil(num_kv_heads / tp), so heads are replicated
    once tp exceeds them).
    """
    kvb = DTYPE_BYTES[kv_dtype(config)]
    total = 0
    for kind in config.layer_pattern:
        if kind in ("mla", "dsa"):
            total += config.mla.latent_dim * kvb
        if kind == "dsa":
            total += config.dsa.index_head_dim * kvb
        if kind == "gqa":
            total += 2 * _heads_per_gpu(config.gqa.num_kv_heads, tp) * config.gqa.head_dim * kvb
        if v4.is_compressed(kind):
            total += v4.layer_bytes_per_token(config, kind)
    return total


def state_bytes_per_seq(config: ModelConfig, tp: int = 1) -> int:
    """Linear-layer state bytes of one sequence on one GPU of a TP group of `tp`: recurrent
    state (fp32 `[HV, K, V]`) and conv state split by head, ceil(heads / tp) per rank."""
    if config.linear is None:
        return 0
    lin = config.linear
    hv = _heads_per_gpu(lin.num_v_heads, tp)
    recurrent = hv * lin.head_k_dim * lin.head_v_dim * 4
    conv = math.ceil(conv_dim(config) / tp) * (lin.conv_kernel_size - 1)
    per_layer = recurrent + conv * DTYPE_BYTES[config.dtype]
    return per_layer * sum(k in ("kda", "gdn") for k in config.layer_pattern)


def attention_read_bytes(config: ModelConfig, context: int, tp: int = 1) -> float:
    """Cache bytes one decode token reads at `context` on one GPU: every cached token of
    mla/gqa layers, every index key but only `index_topk` latents of dsa layers."""
    kvb = DTYPE_BYTES[kv_dtype(config)]
    total = 0.0
    for kind in config.layer_pattern:
        if kind == "mla":
            total += context * config.mla.latent_dim * kvb
        elif kind == "dsa":
            chosen = min(context, config.dsa.index_topk)
            total += chosen * config.mla.latent_dim * kvb
            total += context * config.dsa.index_head_dim * kvb
        elif kind == "gqa":
            heads = _heads_per_gpu(config.gqa.num_kv_heads, tp)
            total += context * 2 * heads * config.gqa.head_dim * kvb
        elif v4.is_compressed(kind):
            total += v4.read_bytes(config, kind, context)
    return total


def _mixer_flops_per_token(config: ModelConfig, kind: str, context: float, prefill: bool) -> float:
    """Attention FLOPs of one token attending to `context` earlier tokens (whole model, one
    layer of `kind`). Prefill MLA runs the expanded form (per head qk + v dims); decode and DSA
    run the absorbed form over the latent."""
    if kind in ("kda", "gdn"):
        lin = config.linear
        state = 4 * lin.num_v_heads * lin.head_k_dim * lin.head_v_dim
        intra = 2 * lin.num_v_heads * LINEAR_CHUNK * (lin.head_k_dim + lin.head_v_dim)
        return state + (intra if prefill else 0)
    if kind == "gqa":
        return 4 * config.gqa.num_heads * config.gqa.head_dim * context
    if v4.is_compressed(kind):
        return v4.flops_per_token(config, kind, context)
    m = config.mla
    absorbed = 2 * m.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
    if kind == "mla":
        if prefill:
            return (
                2 * m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * context
            )
        return absorbed * context
    indexer = 2 * config.dsa.index_n_heads * config.dsa.index_head_dim * context
    return indexer + absorbed * min(context, config.dsa.index_topk)


def attention_flops(config: ModelConfig, context: float, prefill: bool = False) -> float:
    """Attention/recurrence FLOPs of one token at `context`, summed over all layers."""
    return sum(_mixer_flops_per_token(config, k, context, prefill) for k in config.layer_pattern)


def prefill_attention_flops(config: ModelConfig, num_tokens: int) -> float:
    """Attention FLOPs of a causal prefill of `num_tokens` (token t attends to t tokens),
    integrated in closed form per layer kind: quadratic terms T^2/2, DSA's sparse part
    capped at index_topk."""
    t = float(num_tokens)
    total = 0.0
    for kind in config.layer_pattern:
        if kind in ("kda", "gdn"):
            total += t * _mixer_flops_per_token(config, kind, 0, True)
        elif kind in ("gqa", "mla"):
            total += _mixer_flops_per_token(config, kind, 1.0, True) * t * t / 2
        elif v4.is_compressed(kind):  # linear in context past the window: sum over half of it
            total += t * v4.flops_per_token(config, kind, t / 2)
        else:
            m, k = config.mla, config.dsa.index_topk
            absorbed = 2 * m.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
            indexer = 2 * config.dsa.index_n_heads * config.dsa.index_head_dim
            head = min(t, k)
            total += indexer * t * t / 2 + absorbed * (head * head / 2 + max(0.0, t - k) * k)
    return total
