"""DeepSeek-V4 adapter (transformers `deepseek_v4`): swa/csa/hca shared-KV MQA with sinks, hash
then sqrt-softplus MoE, mHC streams; released and transformers tensor names both map."""

from __future__ import annotations

import re
from typing import Any

from hyla.config import CompressedAttentionConfig, ConfigError, ModelConfig, MoEConfig, RopeConfig
from hyla.hf_fields import HFFields, eos_ids, layer_list, model_dtype, require_silu
from hyla.models.weights import (
    Placement,
    default_placement,
    is_rotary_buffer,
    strip_model_prefix,
)

MODEL_TYPE = "deepseek_v4"
ARCHITECTURES = ("DeepseekV4ForCausalLM",)

_LAYER_KINDS = {"sliding_attention": "swa", "compressed_sparse_attention": "csa",
                "heavily_compressed_attention": "hca"}  # fmt: skip
_FFN_KINDS = {"hash_moe": "hash_moe", "moe": "moe"}


def _layer_pattern(f: HFFields, num_layers: int) -> list[str]:
    if f.raw("layer_types", None) is not None:
        return layer_list(f, "layer_types", num_layers, _LAYER_KINDS)
    tail = ["csa" if i % 2 else "hca" for i in range(max(num_layers - 2, 0))]
    return (["hca"] * min(num_layers, 2) + tail)[:num_layers]


def _ffn_pattern(f: HFFields, num_layers: int) -> list[str]:
    if f.raw("mlp_layer_types", None) is not None:
        return layer_list(f, "mlp_layer_types", num_layers, _FFN_KINDS)
    num_hash = f.integer("num_hash_layers", 3, minimum=0)
    return [("hash_moe" if i < num_hash else "moe") for i in range(num_layers)]


def _moe(f: HFFields) -> MoEConfig:
    scoring = f.string("scoring_func", "sqrtsoftplus")
    if scoring != "sqrtsoftplus":
        raise ConfigError(f"scoring_func: only 'sqrtsoftplus' is supported, got {scoring!r}")
    inter = f.integer("moe_intermediate_size", 2048)
    shared = f.integer("n_shared_experts", 1, minimum=0)
    return MoEConfig(
        num_experts=f.integer(("n_routed_experts", "num_local_experts"), 256),
        num_experts_per_tok=f.integer("num_experts_per_tok", 6),
        moe_intermediate_size=inter,
        num_shared_experts=shared,
        shared_intermediate_size=inter * shared,
        scoring="sqrt_softplus",
        routed_scaling_factor=f.number("routed_scaling_factor", 1.5),
        has_correction_bias=True,
    )


def _ropes(f: HFFields, rotary_dim: int) -> tuple[RopeConfig, dict[str, Any]]:
    params = f.raw("rope_parameters", None) or {}
    main = HFFields(params.get("main") or {"rope_theta": f.number("rope_theta", 10000.0)})
    compress = params.get("compress")
    if compress is None:
        compress = {k: v for k, v in params.items() if k not in ("main", "compress")}
        compress["rope_theta"] = f.number("compress_rope_theta", 160000.0)
    skip = {"rope_theta", "rope_type", "type", "partial_rotary_factor", "attention_factor"}
    scaling = tuple(sorted((k, v) for k, v in compress.items() if k not in skip))
    comp = HFFields(compress)
    fields = dict(compress_rope_theta=comp.number("rope_theta", 160000.0),
                  compress_rope_scaling_type=comp.string(("rope_type", "type"), "default"),
                  compress_rope_scaling=scaling)  # fmt: skip
    rope = RopeConfig(theta=main.number("rope_theta", 10000.0), rotary_dim=rotary_dim,
                      style="interleave")  # fmt: skip
    return rope, fields


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    f = HFFields(d)
    require_silu(f)
    num_layers = f.integer("num_hidden_layers", 43)
    layers, ffns = _layer_pattern(f, num_layers), _ffn_pattern(f, num_layers)
    head_dim = f.integer("head_dim", 512)
    partial = f.raw("partial_rotary_factor", None)
    rotary_dim = int(head_dim * partial) if partial else f.integer("qk_rope_head_dim", 64)
    rope, rope_fields = _ropes(f, rotary_dim)
    rates = HFFields(f.raw("compress_rates", None) or {})
    if f.number("hc_eps", 1e-6) <= 0:
        raise ConfigError("hc_eps: must be > 0")
    return ModelConfig(
        vocab_size=f.integer("vocab_size", 129280),
        hidden_size=f.integer("hidden_size", 4096),
        intermediate_size=f.integer("moe_intermediate_size", 2048),
        layer_pattern=tuple(layers),
        ffn_pattern=tuple(ffns),
        architecture=MODEL_TYPE,
        rms_norm_eps=f.number("rms_norm_eps", 1e-6),
        tie_word_embeddings=f.flag("tie_word_embeddings", False),
        max_context_len=f.integer("max_position_embeddings", 1048576),
        dtype=model_dtype(f),
        bos_token_id=f.integer("bos_token_id", 0, minimum=0),
        eos_token_ids=eos_ids(f) or (1,),
        rope=rope,
        compressed=CompressedAttentionConfig(
            num_heads=f.integer("num_attention_heads", 64),
            head_dim=head_dim,
            q_lora_rank=f.integer("q_lora_rank", 1024),
            o_groups=f.integer("o_groups", 8),
            o_lora_rank=f.integer("o_lora_rank", 1024),
            sliding_window=f.integer("sliding_window", 128),
            csa_ratio=rates.integer(
                "compressed_sparse_attention", f.integer("compress_rate_csa", 4)
            ),
            hca_ratio=rates.integer(
                "heavily_compressed_attention", f.integer("compress_rate_hca", 128)
            ),
            index_n_heads=f.integer("index_n_heads", 64),
            index_head_dim=f.integer("index_head_dim", 128),
            index_topk=f.integer("index_topk", 512),
            **rope_fields,
        ),  # fmt: skip
        moe=_moe(f),
        hc_mult=f.integer("hc_mult", 4),
        hc_eps=f.number("hc_eps", 1e-6),
        hc_sinkhorn_iters=f.integer("hc_sinkhorn_iters", 20),
        hc_head_weighted=True,
        swiglu_limit=f.number("swiglu_limit", 10.0),
    )


# (pattern, replacement) in order, on the name without its `model.` prefix
_RENAMES = (
    (r"\.(attn|self_attn)\.", ".mixer."), (r"\.ffn\.", ".mlp."),
    (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight$", "embed_tokens.weight"), (r"^head\.weight$", "lm_head.weight"),
    (r"^hc_head_(fn|base|scale)$", r"hc_head.hc_\1"),
    (r"\.attn_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_(attn|ffn)_(fn|base|scale)$", r".\1_hc.\2"), (r"\.attn_sink$", ".sinks"),
    (r"\.mixer\.indexer\.weights_proj\.", ".mixer.compressor.indexer.scorer.weights_proj."),
    (r"\.mixer\.indexer\.wq_b\.", ".mixer.compressor.indexer.q_b_proj."),
    (r"\.norm\.", ".kv_norm."), (r"\.ape$", ".position_bias"), (r"\.wq_a\.", ".q_a_proj."),
    (r"\.mixer\.wq_b\.", ".mixer.q_b_proj."), (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."), (r"\.wo_a\.", ".o_a_proj."), (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."), (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
)  # fmt: skip


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    if is_rotary_buffer(name) or name.startswith("mtp.") or ".mtp." in name:
        return ()
    name = strip_model_prefix(name)
    for pattern, replacement in _RENAMES:
        name = re.sub(pattern, replacement, name)
    return default_placement(name)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
