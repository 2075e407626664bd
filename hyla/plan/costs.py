"""What a model costs per token and per sequence, split the way parallelism splits it.

    weights  = embedding (embed_tokens + lm_head)  + routed experts  + the rest ("dense")
    cache    = per token, per attention-like layer (mla/dsa latent, dsa index keys, gqa k/v)
    state    = per sequence, per linear layer (recurrent fp32 + conv)

Parameter counts come from a model built on the meta device (`hyla.models.inspect`), byte sizes
from `hyla.cache.spec`; FLOPs are the matmul count (2 per multiply-add) of the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyla.cache.spec import bytes_per_state_slot, bytes_per_token, layer_cache_specs
from hyla.config import ModelConfig
from hyla.distributed.sharding import rank_config
from hyla.models.loader import build_empty_model

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


def cache_bytes_per_token(config: ModelConfig, tp: int = 1, ep: bool = False) -> int:
    """Paged-cache bytes one token costs on one GPU of a tensor-parallel group of `tp`: the
    engine's own allocation (`hyla.cache.spec` tables of the rank's config, fp8 scales and
    GLM-5.3-Flash's pooled-indexer caches included).

    MLA/DSA latents and index keys are shared by all heads, so every rank holds them whole;
    GQA k/v are split by kv head (replicated once tp exceeds them).
    """
    return bytes_per_token(rank_config(config, tp, ep))


def state_bytes_per_seq(config: ModelConfig, tp: int = 1, ep: bool = False) -> int:
    """Linear-layer state bytes of one sequence on one GPU of a TP group of `tp` (recurrent
    state in `mamba_ssm_cache_dtype` and conv state, each rank its own heads), as allocated."""
    return bytes_per_state_slot(rank_config(config, tp, ep))


def attention_read_bytes(config: ModelConfig, context: int, tp: int = 1) -> float:
    """Cache bytes one decode token reads at `context` on one GPU: every cached tensor of every
    token, but only `index_topk` tokens' latents in dsa layers (the indexer picks them)."""
    own = rank_config(config, tp, False)
    total = 0.0
    for i, kind in enumerate(own.layer_pattern):
        for spec in layer_cache_specs(own, i):
            if spec.per != "token":
                continue
            sparse = kind == "dsa" and spec.name.startswith("latent")
            total += (min(context, own.dsa.index_topk) if sparse else context) * spec.nbytes
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
        else:
            m, k = config.mla, config.dsa.index_topk
            absorbed = 2 * m.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
            indexer = 2 * config.dsa.index_n_heads * config.dsa.index_head_dim
            head = min(t, k)
            total += indexer * t * t / 2 + absorbed * (head * head / 2 + max(0.0, t - k) * k)
    return total
