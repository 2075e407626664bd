"""GLM-5 adapter (transformers `glm_moe_dsa`; zai-org/GLM-5, GLM-5-FP8).

DeepSeek-V3.2's architecture (`hyla.models.deepseek_v32`: every layer DSA = MLA + lightning
indexer + top-k, dense then sigmoid-routed MoE with shared experts) with two changes: the
indexer's queries and keys rotate in interleaved pairs (`dsa.index_rope_style`), and
`indexer_types` marks "shared" layers that have no indexer and reuse the top-k of the last full
layer (`hyla.layers.sparse_attention`). Fields absent from config.json take `GlmMoeDsaConfig`'s
defaults. Tensor names are DeepSeek-V3.2's; layers at index >= `num_hidden_layers` (the MTP
module) are skipped; FP8 releases load through `hyla.models.quantization`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hyla.config import ConfigError, ModelConfig
from hyla.models import deepseek_v32
from hyla.models.glm5_next import _indexer_types
from hyla.models.hf_fields import HFFields
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
    """ModelConfig from a GLM-5 `config.json` dict. Raises ConfigError naming the field."""
    d = {**_DEFAULTS, **{k: v for k, v in d.items() if v is not None}}
    base = deepseek_v32.config_from_hf(d)
    f = HFFields(d)
    kinds = _indexer_types(f, base.num_layers)
    if kinds and kinds[0] == "shared":
        raise ConfigError("indexer_types[0]: a shared layer needs a full one before it")
    dsa = dataclasses.replace(base.dsa, indexer_types=kinds, index_rope_style="interleave")
    return base.replace(architecture=MODEL_TYPE, dsa=dsa)


def hf_placement(name: str, config: ModelConfig | None = None) -> tuple[Placement, ...]:
    """Where checkpoint tensor `name` goes in hyla's state dict (empty tuple: skip it)."""
    return deepseek_v32.hf_placement(name, config)


def hf_to_hyla_name(name: str, config: ModelConfig | None = None) -> str | None:
    """hyla state-dict name for checkpoint tensor `name`; None = not loaded."""
    placements = hf_placement(name, config)
    return placements[0].target if placements else None
