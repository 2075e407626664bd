"""GLM-5.3-Flash adapter (transformers `glm5_next`), text model: KDA, NoPE MLA with the pooled
DSA indexer, clamped SwiGLU MoE, `hc_mult` streams; multimodal or flat configs."""

from __future__ import annotations

import re
from typing import Any

from hyla.config import (
    ConfigError,
    DSAConfig,
    LinearAttentionConfig,
    MLAConfig,
    ModelConfig,
    MoEConfig,
)
from hyla.hf_fields import HFFields, eos_ids, layer_list, model_dtype, require_silu
from hyla.models.kimi_linear import hf_placement as kimi_placement
from hyla.models.weights import Placement, layer_index

MODEL_TYPE = "glm5_next"
ARCHITECTURES = ("Glm5NextForConditionalGeneration",)

_LAYER_KINDS = {"linear_attention": "kda", "indexed_attention": "dsa", "full_attention": "dsa"}
_FFN_KINDS = {"dense": "dense", "sparse": "moe"}


def text_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The text model's fields: `text_config` of a multimodal config, else the config itself."""
    text = d.get("text_config")
    if text is None:
        return d
    if not isinstance(text, dict):
        raise ConfigError(f"text_config: expected an object, got {type(text).__name__}")
    return text


def _layer_pattern(f: HFFields, num_layers: int) -> list[str]:
    if f.raw("layer_types", None) is not None:
        return layer_list(f, "layer_types", num_layers, _LAYER_KINDS)
    return ["dsa" if i % 4 == 3 else "kda" for i in range(num_layers)]


def _ffn_pattern(f: HFFields, num_layers: int) -> list[str]:
    if f.raw("mlp_layer_types", None) is not None:
        return layer_list(f, "mlp_layer_types", num_layers, _FFN_KINDS)
    return ["dense" if i < 3 else "moe" for i in range(num_layers)]


def _indexer_types(f: HFFields, num_layers: int) -> tuple[str, ...]:
    """`indexer_types`, else `index_topk_pattern`, else the freq/offset schedule (transformers')."""
    if f.raw("indexer_types", None) is not None:
        kinds = {"full": "full", "shared": "shared"}
        return tuple(layer_list(f, "indexer_types", num_layers, kinds))
    pattern = f.raw("index_topk_pattern", None)
    if pattern is not None:
        if isinstance(pattern, str):
            pattern = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
        return tuple(layer_list(HFFields({"index_topk_pattern": pattern}),
                                "index_topk_pattern", num_layers,
                                {"full": "full", "shared": "shared"}))  # fmt: skip
    freq = max(f.integer("index_topk_freq", 1), 1)
    offset = f.integer("index_skip_topk_offset", 2, minimum=0)
    return tuple(
        "full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)
    )


def _linear(f: HFFields) -> LinearAttentionConfig:
    lin = HFFields(f.raw("linear_attn_config", {}))
    if "linear_lower_bound" in f.data:  # null: the unbounded softplus gate
        bound = f.data["linear_lower_bound"]
    else:
        bound = -5.0
    bound = lin.raw("gate_lower_bound", bound)
    if bound is None and lin.flag("safe_gate", False):
        bound = -5.0
    if bound is None:  # the softplus gate would also need A_log stored [1, 1, H, 1]
        raise ConfigError("linear_lower_bound: only the bounded forget gate is supported, got null")
    if not isinstance(bound, (int, float)) or isinstance(bound, bool):
        raise ConfigError(f"linear_lower_bound: expected a number, got {bound!r}")
    heads = lin.integer("num_heads", f.integer("linear_num_heads", 64))
    head_dim = lin.integer("head_dim", f.integer("linear_head_dim", 128))
    return LinearAttentionConfig(
        num_k_heads=heads,
        num_v_heads=heads,
        head_k_dim=head_dim,
        head_v_dim=head_dim,
        conv_kernel_size=lin.integer(
            "short_conv_kernel_size", f.integer("linear_conv_kernel_dim", 4)
        ),
        gate_lower_bound=float(bound),
    )


def _moe(f: HFFields) -> MoEConfig:
    inter = f.integer("moe_intermediate_size", 2048)
    shared = f.integer("n_shared_experts", 1, minimum=0)
    return MoEConfig(
        num_experts=f.integer(("n_routed_experts", "num_local_experts"), 288),
        num_experts_per_tok=f.integer("num_experts_per_tok", 8),
        moe_intermediate_size=inter,
        num_shared_experts=shared,
        shared_intermediate_size=inter * shared,
        scoring="sigmoid",
        n_group=f.integer("n_group", 1),
        topk_group=f.integer("topk_group", 1),
        routed_scaling_factor=f.number("routed_scaling_factor", 2.5),
        norm_topk_prob=f.flag("norm_topk_prob", True),
        has_correction_bias=True,
    )


def _mla(f: HFFields) -> MLAConfig:
    if f.integer("qk_rope_head_dim", 0, minimum=0) != 0:
        raise ConfigError("qk_rope_head_dim: GLM-5.3-Flash's DSA layers are NoPE, expected 0")
    if f.raw("q_lora_rank", 1536) is None:
        raise ConfigError("q_lora_rank: must be an integer (the DSA indexer reads q_a), got null")
    return MLAConfig(
        num_heads=f.integer("num_attention_heads", 64),
        kv_lora_rank=f.integer("kv_lora_rank", 512),
        qk_nope_head_dim=f.integer("qk_nope_head_dim", 256),
        qk_rope_head_dim=0,
        v_head_dim=f.integer("v_head_dim", 256),
        q_lora_rank=f.integer("q_lora_rank", 1536),
        use_rope=False,
        norm_eps=f.number("rms_norm_eps", 1e-5),  # q_a/kv_a_layernorm use rms_norm_eps here
        bias=f.flag("attention_bias", False),
    )


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    top = HFFields(d)
    f = HFFields(text_fields(d))
    require_silu(f)
    num_layers = f.integer("num_hidden_layers", 45)
    layers = _layer_pattern(f, num_layers)
    ffns = _ffn_pattern(f, num_layers)
    limit = f.raw("swiglu_limit", 10.0)
    return ModelConfig(
        vocab_size=f.integer("vocab_size", 154880),
        hidden_size=f.integer("hidden_size", 4096),
        intermediate_size=f.integer("intermediate_size", 12288),
        layer_pattern=tuple(layers),
        ffn_pattern=tuple(ffns),
        architecture=MODEL_TYPE,
        rms_norm_eps=f.number("rms_norm_eps", 1e-5),
        tie_word_embeddings=top.flag("tie_word_embeddings", False),
        max_context_len=f.integer("max_position_embeddings", 1048576),
        dtype=model_dtype(f) if "text_config" not in d else model_dtype(top),
        bos_token_id=f.integer("bos_token_id", None, minimum=0),
        eos_token_ids=eos_ids(f) or eos_ids(top),
        rope=None,
        linear=_linear(f) if "kda" in layers else None,
        mla=_mla(f),
        dsa=DSAConfig(
            index_n_heads=f.integer("index_n_heads", 32),
            index_head_dim=f.integer("index_head_dim", 128),
            index_topk=f.integer("index_topk", 2048),
            index_kpool=f.integer("index_kpool", 16),
            index_kpool_always_select_tail=f.flag("index_kpool_always_select_tail", True),
            indexer_types=_indexer_types(f, num_layers),
        ),
        moe=_moe(f) if "moe" in ffns else None,
        hc_mult=f.integer("hc_mult", 4),
        hc_eps=f.number("hc_eps", 1e-6),
        hc_sinkhorn_iters=f.integer("hc_sinkhorn_iters", 20),
        swiglu_limit=None if limit is None else f.number("swiglu_limit"),
    )


_PREFIX_RE = re.compile(r"^model\.(language_model\.)?")
_HC_RE = re.compile(r"^(layers\.\d+)\.hc_(attn|ffn)_(fn|base|scale)$")


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    if name.startswith(("model.visual.", "visual.")) or ".shared_head." in name:
        return ()
    name = _PREFIX_RE.sub("", name)
    layer = layer_index(name)
    if config is not None and layer is not None and layer >= config.num_layers:
        return ()
    hc = _HC_RE.match(name)
    if hc:
        name = f"{hc.group(1)}.{hc.group(2)}_hc.{hc.group(3)}"
    return kimi_placement(name, config)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
