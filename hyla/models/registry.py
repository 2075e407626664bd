"""Model-family registry: `model_type` (else `architectures[0]`) -> adapter: `config_from_hf`
(ConfigError names the field), `hf_placement` (() skips), `hf_to_hyla_name` (None: not
loaded). `model_type: "hyla"` is hyla's own layout."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from hyla.config import ConfigError, ModelConfig
from hyla.models.weights import Placement

# model_type -> adapter module (each has MODEL_TYPE, ARCHITECTURES, config_from_hf, hf_placement)
ADAPTERS = {
    "kimi_linear": "hyla.models.kimi_linear",
    "deepseek_v32": "hyla.models.deepseek_v32",
    "qwen3_next": "hyla.models.qwen3_next",
    "glm5_next": "hyla.models.glm5_next",
    "qwen3_5": "hyla.models.qwen3_5",
    "qwen3_5_moe": "hyla.models.qwen3_5_moe",
    "glm_moe_dsa": "hyla.models.glm_moe_dsa",
    "deepseek_v4": "hyla.models.deepseek_v4",
}
ARCHITECTURES = {
    "KimiLinearForCausalLM": "kimi_linear",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Glm5NextForConditionalGeneration": "glm5_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    "DeepseekV4ForCausalLM": "deepseek_v4",
}
NATIVE = "hyla"
_TEXT_ONLY = ("glm5_next_text", "qwen3_5_text", "qwen3_5_moe_text")


def family_of(hf_config: dict[str, Any]) -> str:
    """The family, "hyla" or a key of ADAPTERS; ConfigError names `model_type` if unsupported."""
    if not isinstance(hf_config, dict):
        raise ConfigError(f"config: expected a JSON object, got {type(hf_config).__name__}")
    model_type = hf_config.get("model_type")
    if model_type in _TEXT_ONLY:  # flat text-only configs
        return model_type.removesuffix("_text")
    if model_type == NATIVE or model_type in ADAPTERS:
        return model_type
    for arch in hf_config.get("architectures") or ():
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    supported = ", ".join([NATIVE, *ADAPTERS])
    raise ConfigError(
        f"model_type: unsupported architecture {model_type!r} "
        f"(architectures={hf_config.get('architectures')!r}); supported: {supported}"
    )


def adapter(family: str) -> ModuleType:
    if family not in ADAPTERS:
        raise ConfigError(f"model_type: no adapter for {family!r}")
    return importlib.import_module(ADAPTERS[family])


def config_from_hf(hf_config: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a parsed `config.json` (any supported family, or hyla's layout)."""
    family = family_of(hf_config)
    if family == NATIVE:
        config = ModelConfig.from_dict(hf_config)
        if config.architecture != NATIVE and config.architecture not in ADAPTERS:
            supported = ", ".join([NATIVE, *ADAPTERS])
            raise ConfigError(
                f"architecture: {config.architecture!r} names no tensor layout; "
                f"supported: {supported}"
            )
        return config
    return adapter(family).config_from_hf(hf_config)


def placement_for(config: ModelConfig, name: str) -> tuple[Placement, ...]:
    """Where checkpoint tensor `name` goes for `config.architecture` (() = known and skipped)."""
    if config.architecture == NATIVE:
        return (Placement(name),)
    return adapter(config.architecture).hf_placement(name, config)
