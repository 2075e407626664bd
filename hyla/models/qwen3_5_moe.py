"""Qwen3.5-MoE adapter (transformers `qwen3_5_moe`), text model: Qwen3.5's with every FFN
Qwen3-Next's MoE (softmax top-k, always renormalised, plus a sigmoid-gated shared expert)."""

from __future__ import annotations

from typing import Any

from hyla.config import ConfigError, ModelConfig, MoEConfig
from hyla.hf_fields import HFFields
from hyla.models import qwen3_5
from hyla.models.glm5_next import text_fields
from hyla.models.weights import Placement

MODEL_TYPE = "qwen3_5_moe"
ARCHITECTURES = ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM")


def _moe(f: HFFields) -> MoEConfig:
    shared = f.integer("shared_expert_intermediate_size", 512, minimum=0)
    return MoEConfig(
        num_experts=f.integer("num_experts", 256),
        num_experts_per_tok=f.integer("num_experts_per_tok", 8),
        moe_intermediate_size=f.integer("moe_intermediate_size", 512),
        num_shared_experts=1 if shared else 0,
        shared_intermediate_size=shared,
        scoring="softmax",
        norm_topk_prob=True,
        shared_expert_gate=bool(shared),
    )


# Qwen3_5MoeTextConfig's defaults where they differ from Qwen3.5's (the dense reader's)
_DEFAULTS = {"hidden_size": 2048, "num_hidden_layers": 40, "num_key_value_heads": 2}


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    f = HFFields(text_fields(d))
    if f.raw("norm_topk_prob", True) is not True:
        raise ConfigError("norm_topk_prob: Qwen3.5-MoE always renormalises its top-k weights")
    moe = _moe(f)
    text = {k: v for k, v in text_fields(d).items() if v is not None}
    # every FFN is MoE: hyla's unused dense width is the shared expert's
    text = {**_DEFAULTS, "intermediate_size": moe.shared_intermediate_size or 1, **text}
    dense = qwen3_5.config_from_hf({**d, "text_config": text} if "text_config" in d else text)
    return dense.replace(architecture=MODEL_TYPE, ffn_pattern=("moe",) * dense.num_layers, moe=moe)


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    return qwen3_5.hf_placement(name, config)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
