"""Kimi-Linear adapter (transformers `kimi_linear`): KDA and NoPE MLA, sigmoid MoE with a shared
expert; reads the original release's and transformers' config and tensor names."""

from __future__ import annotations

import re
from typing import Any

from hyla.config import ConfigError, LinearAttentionConfig, MLAConfig, ModelConfig, MoEConfig
from hyla.hf_fields import (
    HFFields,
    eos_ids,
    layer_list,
    model_dtype,
    require_silu,
)
from hyla.models.weights import (
    Placement,
    default_placement,
    is_rotary_buffer,
    rename_mixer,
    strip_model_prefix,
)

MODEL_TYPE = "kimi_linear"
ARCHITECTURES = ("KimiLinearForCausalLM",)

_LAYER_KINDS = {"linear_attention": "kda", "full_attention": "mla"}
_FFN_KINDS = {"dense": "dense", "sparse": "moe"}


def _layer_pattern(f: HFFields, num_layers: int) -> list[str]:
    if f.raw("layer_types", None) is not None:
        return layer_list(f, "layer_types", num_layers, _LAYER_KINDS)
    lin = HFFields(f.raw("linear_attn_config", {}))
    if "full_attn_layers" in lin.data and "kda_layers" in lin.data:
        kinds: list[str | None] = [None] * num_layers
        for key, kind in (("full_attn_layers", "mla"), ("kda_layers", "kda")):
            for layer in lin.sequence(key):  # 1-based in the original config
                if not isinstance(layer, int) or not 1 <= layer <= num_layers:
                    raise ConfigError(f"linear_attn_config.{key}: bad layer number {layer!r}")
                kinds[layer - 1] = kind
        if None in kinds:
            raise ConfigError(
                f"linear_attn_config: layer {kinds.index(None) + 1} is in neither "
                "kda_layers nor full_attn_layers"
            )
        return kinds
    return ["mla" if i and i % 4 == 0 else "kda" for i in range(num_layers)]


def _ffn_pattern(f: HFFields, num_layers: int) -> list[str]:
    if f.raw("mlp_layer_types", None) is not None:
        return layer_list(f, "mlp_layer_types", num_layers, _FFN_KINDS)
    first_dense = f.integer("first_k_dense_replace", 1, minimum=0)
    freq = f.integer("moe_layer_freq", 1)
    return ["moe" if i >= first_dense and i % freq == 0 else "dense" for i in range(num_layers)]


def _moe(f: HFFields) -> MoEConfig:
    scoring = f.string("moe_router_activation_func", "sigmoid")
    if scoring != "sigmoid":
        raise ConfigError(
            f"moe_router_activation_func: only 'sigmoid' is supported, got {scoring!r}"
        )
    inter = f.integer("moe_intermediate_size", 1024)
    shared = f.integer(("num_shared_experts", "n_shared_experts"), 1, minimum=0)
    return MoEConfig(
        num_experts=f.integer(("num_experts", "num_local_experts"), 256),
        num_experts_per_tok=f.integer(("num_experts_per_token", "num_experts_per_tok"), 8),
        moe_intermediate_size=inter,
        num_shared_experts=shared,
        shared_intermediate_size=inter * shared,
        scoring="sigmoid",
        n_group=f.integer(("num_expert_group", "n_group"), 1),
        topk_group=f.integer("topk_group", 1),
        routed_scaling_factor=f.number("routed_scaling_factor", 2.446),
        norm_topk_prob=f.flag(("moe_renormalize", "norm_topk_prob"), True),
        has_correction_bias=True,
    )


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    f = HFFields(d)
    require_silu(f)
    num_layers = f.integer("num_hidden_layers")
    layers = _layer_pattern(f, num_layers)
    ffns = _ffn_pattern(f, num_layers)
    lin = HFFields(f.raw("linear_attn_config", {}))
    heads = lin.integer("num_heads", f.integer("linear_num_heads", 32))
    head_dim = lin.integer("head_dim", f.integer("linear_head_dim", 128))
    # The released modeling code asserts mla_use_nope and transformers' KimiLinearAttention never
    # rotates: a rope MLA would match neither reference, so it is refused rather than guessed.
    if not f.flag("mla_use_nope", True):
        raise ConfigError("mla_use_nope: only true (NoPE MLA) is supported, got false")
    qk_rope = f.integer("qk_rope_head_dim", 64, minimum=0)
    return ModelConfig(
        vocab_size=f.integer("vocab_size"),
        hidden_size=f.integer("hidden_size"),
        intermediate_size=f.integer("intermediate_size"),
        layer_pattern=tuple(layers),
        ffn_pattern=tuple(ffns),
        architecture=MODEL_TYPE,
        rms_norm_eps=f.number("rms_norm_eps", 1e-5),
        tie_word_embeddings=f.flag("tie_word_embeddings", False),
        max_context_len=f.integer(("model_max_length", "max_position_embeddings"), 1048576),
        dtype=model_dtype(f),
        bos_token_id=f.integer("bos_token_id", 163584, minimum=0),
        eos_token_ids=eos_ids(f) or (163586,),
        rope=None,
        linear=LinearAttentionConfig(
            num_k_heads=heads,
            num_v_heads=heads,
            head_k_dim=head_dim,
            head_v_dim=head_dim,
            conv_kernel_size=lin.integer(
                "short_conv_kernel_size", f.integer("linear_conv_kernel_dim", 4)
            ),
        ),
        mla=MLAConfig(
            num_heads=f.integer("num_attention_heads"),
            kv_lora_rank=f.integer("kv_lora_rank", 512),
            qk_nope_head_dim=f.integer("qk_nope_head_dim", 128),
            qk_rope_head_dim=qk_rope,
            v_head_dim=f.integer("v_head_dim", 128),
            q_lora_rank=f.integer("q_lora_rank", None),
            use_rope=False,
            bias=f.flag("attention_bias", False),
        ),
        moe=_moe(f) if "moe" in ffns else None,
    )


_FORGET_GATE_RE = re.compile(r"\.mixer\.forget_gate\.")
_FUSED_CONV_RE = re.compile(r"^(layers\.\d+\.mixer)\.conv1d\.weight$")


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    if is_rotary_buffer(name):
        return ()
    name = strip_model_prefix(name)
    name = rename_mixer(name, ("self_attn",)).replace(".block_sparse_moe.", ".mlp.")
    name = _FORGET_GATE_RE.sub(".mixer.", name)
    conv = _FUSED_CONV_RE.match(name)
    if conv:
        return tuple(Placement(f"{conv.group(1)}.{p}_conv1d.weight") for p in "qkv")
    return default_placement(name)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    """hyla name of checkpoint tensor `name` (fused target of an expert piece; q_conv1d for a
    fused `conv1d.weight`); None = skipped."""
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
