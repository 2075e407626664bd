"""GLM-5 adapter (transformers `glm_moe_dsa`): DeepSeek-V3.2 plus interleaved indexer rope and
"shared" `indexer_types` layers reusing the last full layer's top-k."""

from __future__ import annotations

import dataclasses
from typing import Any

from hyla.config import ConfigError, ModelConfig
from hyla.hf_fields import HFFields
from hyla.models import deepseek_v32
from hyla.models.glm5_next import _indexer_types
from hyla.models.weights import Placement

MODEL_TYPE = "glm_moe_dsa"
ARCHITECTURES = ("GlmMoeDsaForCausalLM",)

# GlmMoeDsaConfig's defaults (transformers 5.24) where DeepSeek-V3.2's reader has others
_DEFAULTS = {
    "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64,
    "n_routed_experts": 256, "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_rope_head_dim": 64,
    "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
    "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "index_n_heads": 32,
    "bos_token_id": 0, "eos_token_id": 1,
}  # fmt: skip


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    d = {**_DEFAULTS, **{k: v for k, v in d.items() if v is not None}}
    base = deepseek_v32.config_from_hf(d)
    f = HFFields(d)
    kinds = _indexer_types(f, base.num_layers)
    if kinds and kinds[0] == "shared":
        raise ConfigError("indexer_types[0]: a shared layer needs a full one before it")
    dsa = dataclasses.replace(base.dsa, indexer_types=kinds, index_rope_style="interleave")
    return base.replace(architecture=MODEL_TYPE, dsa=dsa)


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    return deepseek_v32.hf_placement(name, config)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
