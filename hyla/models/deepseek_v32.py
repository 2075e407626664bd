"""DeepSeek-V3.2 adapter (transformers `deepseek_v32`): every layer DSA, dense then grouped top-k
sigmoid MoE; MTP layers (index >= `num_hidden_layers`) are skipped."""

from __future__ import annotations

from typing import Any

from hyla.config import ConfigError, DSAConfig, MLAConfig, ModelConfig, MoEConfig
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
    layer_index,
    rename_mixer,
    strip_model_prefix,
)

MODEL_TYPE = "deepseek_v32"
ARCHITECTURES = ("DeepseekV32ForCausalLM",)

_FFN_KINDS = {"dense": "dense", "sparse": "moe"}


def _ffn_pattern(f: HFFields, num_layers: int) -> list[str]:
    if f.raw("mlp_layer_types", None) is not None:
        return layer_list(f, "mlp_layer_types", num_layers, _FFN_KINDS)
    first_dense = min(f.integer("first_k_dense_replace", 3, minimum=0), num_layers)
    freq = f.integer("moe_layer_freq", 1)
    return ["moe" if i >= first_dense and i % freq == 0 else "dense" for i in range(num_layers)]


def _moe(f: HFFields) -> MoEConfig:
    scoring = f.string("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        raise ConfigError(f"scoring_func: only 'sigmoid' is supported, got {scoring!r}")
    inter = f.integer("moe_intermediate_size", 2048)
    shared = f.integer("n_shared_experts", 1, minimum=0)
    return MoEConfig(
        num_experts=f.integer(("n_routed_experts", "num_local_experts", "num_experts"), 256),
        num_experts_per_tok=f.integer("num_experts_per_tok", 8),
        moe_intermediate_size=inter,
        num_shared_experts=shared,
        shared_intermediate_size=inter * shared,
        scoring="sigmoid",
        n_group=f.integer("n_group", 8),
        topk_group=f.integer("topk_group", 4),
        routed_scaling_factor=f.number("routed_scaling_factor", 2.5),
        norm_topk_prob=f.flag("norm_topk_prob", True),
        has_correction_bias=True,
    )


# transformers >= 5.2x writes "indexed_attention", earlier 5.x "deepseek_sparse_attention"
LAYER_TYPES = {"indexed_attention": "dsa", "deepseek_sparse_attention": "dsa"}


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    f = HFFields(d)
    require_silu(f)
    num_layers = f.integer("num_hidden_layers")
    if f.raw("layer_types", None) is not None:
        layer_list(f, "layer_types", num_layers, LAYER_TYPES)
    ffns = _ffn_pattern(f, num_layers)
    qk_rope = f.integer("qk_rope_head_dim", 64)
    if "q_lora_rank" in d and d["q_lora_rank"] is None:  # not the default: DSA needs q_a_proj
        raise ConfigError("q_lora_rank: must be an integer (the DSA indexer reads q_a), got null")
    quant = f.raw("quantization_config", None)
    extra = (("quantization", str(quant.get("quant_method"))),) if isinstance(quant, dict) else ()
    return ModelConfig(
        vocab_size=f.integer("vocab_size"),
        hidden_size=f.integer("hidden_size"),
        intermediate_size=f.integer("intermediate_size"),
        layer_pattern=("dsa",) * num_layers,
        ffn_pattern=tuple(ffns),
        architecture=MODEL_TYPE,
        rms_norm_eps=f.number("rms_norm_eps", 1e-6),
        tie_word_embeddings=f.flag("tie_word_embeddings", False),
        max_context_len=f.integer("max_position_embeddings", 163840),
        dtype=model_dtype(f),
        bos_token_id=f.integer("bos_token_id", 0, minimum=0),
        eos_token_ids=eos_ids(f) or (1,),
        rope=rope_config(f, qk_rope, "interleave", 10000.0),
        mla=MLAConfig(
            num_heads=f.integer("num_attention_heads"),
            kv_lora_rank=f.integer("kv_lora_rank", 512),
            qk_nope_head_dim=f.integer("qk_nope_head_dim", 128),
            qk_rope_head_dim=qk_rope,
            v_head_dim=f.integer("v_head_dim", 128),
            q_lora_rank=f.integer("q_lora_rank", 1536),
            use_rope=True,
            bias=f.flag("attention_bias", False),
        ),
        dsa=DSAConfig(
            index_n_heads=f.integer("index_n_heads", 64),
            index_head_dim=f.integer("index_head_dim", 128),
            index_topk=f.integer("index_topk", 2048),
        ),
        moe=_moe(f) if "moe" in ffns else None,
        extra=extra,
    )


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    if is_rotary_buffer(name):
        return ()
    name = strip_model_prefix(name)
    layer = layer_index(name)
    if config is not None and layer is not None and layer >= config.num_layers:
        return ()
    name = rename_mixer(name, ("self_attn",))
    return default_placement(name)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
