"""Qwen3.5 adapter (transformers `qwen3_5`), text model: flat Gated DeltaNet, gated GQA, dense
SwiGLU, zero-centred norms; its M-RoPE's text rows all hold the position (1-D RoPE)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hyla.config import GQAConfig, LinearAttentionConfig, ModelConfig, RopeConfig
from hyla.hf_fields import HFFields, eos_ids, model_dtype, require_silu, rope_config
from hyla.models.glm5_next import text_fields
from hyla.models.qwen3_next import _layer_pattern
from hyla.models.qwen3_next import hf_placement as qwen3_next_placement
from hyla.models.weights import Placement

MODEL_TYPE = "qwen3_5"
ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM")
DEFAULT_MROPE_SECTION = [11, 11, 10]  # `Qwen3_5TextRotaryEmbedding`'s default


def _with_mrope_section(rope: RopeConfig) -> RopeConfig:
    if "mrope_section" in rope.scaling_dict():
        return rope
    scaling = tuple(sorted((*rope.scaling, ("mrope_section", DEFAULT_MROPE_SECTION))))
    return dataclasses.replace(rope, scaling=scaling)


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    top = HFFields(d)
    f = HFFields(text_fields(d))
    require_silu(f)
    num_layers = f.integer("num_hidden_layers", 32)
    head_dim = f.integer("head_dim", 256)
    return ModelConfig(
        vocab_size=f.integer("vocab_size", 248320),
        hidden_size=f.integer("hidden_size", 4096),
        intermediate_size=f.integer("intermediate_size", 12288),
        layer_pattern=tuple(_layer_pattern(f, num_layers)),
        ffn_pattern=("dense",) * num_layers,
        architecture=MODEL_TYPE,
        rms_norm_eps=f.number("rms_norm_eps", 1e-6),
        norm_offset=1.0,
        tie_word_embeddings=top.flag("tie_word_embeddings", False),
        max_context_len=f.integer("max_position_embeddings", 32768),
        dtype=model_dtype(top) if "text_config" in d else model_dtype(f),
        bos_token_id=f.integer("bos_token_id", None, minimum=0),
        eos_token_ids=eos_ids(f) or eos_ids(top),
        rope=_with_mrope_section(rope_config(f, head_dim, "neox", 10000.0, default_partial=0.25)),
        linear=LinearAttentionConfig(
            num_k_heads=f.integer("linear_num_key_heads", 16),
            num_v_heads=f.integer("linear_num_value_heads", 32),
            head_k_dim=f.integer("linear_key_head_dim", 128),
            head_v_dim=f.integer("linear_value_head_dim", 128),
            conv_kernel_size=f.integer("linear_conv_kernel_dim", 4),
            projection_layout="flat",
        ),
        gqa=GQAConfig(
            num_heads=f.integer("num_attention_heads", 16),
            num_kv_heads=f.integer("num_key_value_heads", 4),
            head_dim=head_dim,
            qk_norm=True,
            output_gate=True,
            bias=f.flag("attention_bias", False),
        ),
    )


_PREFIX_RE = re.compile(r"^model\.(language_model\.)?")


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    if name.startswith(("model.visual.", "visual.", "mtp.")):
        return ()
    return qwen3_next_placement(_PREFIX_RE.sub("", name), config)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
