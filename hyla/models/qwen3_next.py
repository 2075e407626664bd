"""Qwen3-Next adapter (transformers `qwen3_next`): Gated DeltaNet and gated GQA, softmax MoE with
a sigmoid-gated shared expert, zero-centred norms; `mtp.*` is skipped."""

from __future__ import annotations

from typing import Any

from hyla.config import GQAConfig, LinearAttentionConfig, ModelConfig, MoEConfig
from hyla.hf_fields import (
    HFFields,
    eos_ids,
    layer_list,
    model_dtype,
    require_silu,
    rope_config,
)
from hyla.models.weights import (
    Placement,
    default_placement,
    is_rotary_buffer,
    rename_mixer,
    strip_model_prefix,
)

MODEL_TYPE = "qwen3_next"
ARCHITECTURES = ("Qwen3NextForCausalLM",)

_LAYER_KINDS = {"linear_attention": "gdn", "full_attention": "gqa"}


def _layer_pattern(f: HFFields, num_layers: int) -> list[str]:
    if f.raw("layer_types", None) is not None:
        return layer_list(f, "layer_types", num_layers, _LAYER_KINDS)
    interval = f.integer("full_attention_interval", 4)
    return ["gqa" if (i + 1) % interval == 0 else "gdn" for i in range(num_layers)]


def _ffn_pattern(f: HFFields, num_layers: int) -> list[str]:
    dense_only = set(f.sequence("mlp_only_layers", []))
    step = f.integer("decoder_sparse_step", 1)
    has_experts = f.integer("num_experts", 512, minimum=0) > 0
    return [
        "moe" if i not in dense_only and has_experts and (i + 1) % step == 0 else "dense"
        for i in range(num_layers)
    ]


def _moe(f: HFFields) -> MoEConfig:
    shared = f.integer("shared_expert_intermediate_size", 512, minimum=0)
    return MoEConfig(
        num_experts=f.integer("num_experts", 512),
        num_experts_per_tok=f.integer("num_experts_per_tok", 10),
        moe_intermediate_size=f.integer("moe_intermediate_size", 512),
        num_shared_experts=1 if shared else 0,
        shared_intermediate_size=shared,
        scoring="softmax",
        norm_topk_prob=f.flag("norm_topk_prob", True),
        shared_expert_gate=bool(shared),
    )


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    f = HFFields(d)
    require_silu(f)
    num_layers = f.integer("num_hidden_layers")
    ffns = _ffn_pattern(f, num_layers)
    heads = f.integer("num_attention_heads")
    head_dim = f.integer("head_dim", 256)
    rope = rope_config(f, head_dim, "neox", 10000.0, default_partial=0.25)
    return ModelConfig(
        vocab_size=f.integer("vocab_size"),
        hidden_size=f.integer("hidden_size"),
        intermediate_size=f.integer("intermediate_size"),
        layer_pattern=tuple(_layer_pattern(f, num_layers)),
        ffn_pattern=tuple(ffns),
        architecture=MODEL_TYPE,
        rms_norm_eps=f.number("rms_norm_eps", 1e-6),
        norm_offset=1.0,
        tie_word_embeddings=f.flag("tie_word_embeddings", False),
        max_context_len=f.integer("max_position_embeddings", 32768),
        dtype=model_dtype(f),
        bos_token_id=f.integer("bos_token_id", None, minimum=0),
        eos_token_ids=eos_ids(f),
        rope=rope,
        linear=LinearAttentionConfig(
            num_k_heads=f.integer("linear_num_key_heads", 16),
            num_v_heads=f.integer("linear_num_value_heads", 32),
            head_k_dim=f.integer("linear_key_head_dim", 128),
            head_v_dim=f.integer("linear_value_head_dim", 128),
            conv_kernel_size=f.integer("linear_conv_kernel_dim", 4),
        ),
        gqa=GQAConfig(
            num_heads=heads,
            num_kv_heads=f.integer("num_key_value_heads", 2),
            head_dim=head_dim,
            qk_norm=True,
            output_gate=True,
            bias=f.flag("attention_bias", False),
        ),
        moe=_moe(f) if "moe" in ffns else None,
    )


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    if is_rotary_buffer(name) or name.startswith("mtp."):
        return ()
    name = strip_model_prefix(name)
    name = rename_mixer(name, ("self_attn", "linear_attn"))
    name = name.replace(".mlp.shared_expert.", ".mlp.shared_experts.")
    return default_placement(name)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
