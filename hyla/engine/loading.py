"""Assembling an `LLMEngine` from a checkpoint directory: device, dtype, tokenizer, model or
tensor-parallel executor, vision runtime, warm-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from hyla.cache.manager import CacheManager
from hyla.config import CacheConfig, ConfigError, EngineConfig
from hyla.engine.memory import CachePlan
from hyla.engine.startup import TOKENIZER_FILES, load_chat_template
from hyla.engine.warmup import warm_up
from hyla.multimodal.inputs import ImageLimits
from hyla.multimodal.runtime import MultimodalRuntime

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "default_model"


def load_engine(engine_class: Any, path: str | None = None, **overrides: Any) -> Any:
    """A warmed-up `engine_class` over checkpoint `path` (None: the embedded default model).
    Raises ConfigError for a bad option, FileNotFoundError for a missing checkpoint."""
    from hyla.models.loader import load_model

    config = resolve_device(EngineConfig.from_kwargs(**overrides))
    if config.uses_executor:  # first: a rank re-running an unguarded script stops here
        from hyla.distributed.executor import check_not_in_rank_start

        check_not_in_rank_start()
    directory = Path(path) if path is not None else DEFAULT_MODEL_DIR
    if not directory.exists():
        raise FileNotFoundError(f"model: {directory} does not exist")
    tokenizer = load_tokenizer(config.tokenizer or str(directory))
    if config.tokenizer and tokenizer is None:
        raise ConfigError(
            f"tokenizer: no tokenizer.json or tokenizer_config.json in {config.tokenizer}"
        )
    if config.chat_template is not None:
        if tokenizer is None:
            raise ConfigError("chat_template: this model has no tokenizer to render with")
        tokenizer.chat_template = load_chat_template(config.chat_template)
    if config.uses_executor:
        from hyla.distributed.executor import start_executor

        executor = start_executor(directory, config, load_dtype(config))
        limits = ImageLimits(config.limit_mm_per_prompt, config.max_image_pixels)
        multimodal = MultimodalRuntime.from_path(directory, executor.driver.model, limits)
        model = executor.driver.model
        engine = engine_class(model, tokenizer, config, multimodal, executor=executor)
    else:
        model = load_model(
            str(directory), dtype=load_dtype(config), device=config.device,
            quantization=config.quantization, kv_cache_dtype=config.cache.kv_cache_dtype,
            mamba_ssm_cache_dtype=config.cache.mamba_ssm_cache_dtype,
        )  # fmt: skip
        limits = ImageLimits(config.limit_mm_per_prompt, config.max_image_pixels)
        multimodal = MultimodalRuntime.from_path(directory, model, limits)
        engine = engine_class(model, tokenizer, config, multimodal)
    engine.model_name = "default" if path is None else directory.name
    warm_up(engine)
    return engine


def load_tokenizer(path: str | Path) -> Any:
    directory = Path(path)
    if not any((directory / name).exists() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Silences the warning about hyla's model_type, unknown to transformers.
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    finally:
        hf_logging.set_verbosity(previous)
    # The engine checks prompt lengths itself: mark transformers' length warning as given.
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


def checkpoint_policy(cache: CacheConfig, device: torch.device) -> str:
    """Resolves "auto": "repeat" on CUDA (a mid-chunk state splits the fla call), else "all"."""
    if cache.prefix_checkpoint_policy != "auto":
        return cache.prefix_checkpoint_policy
    return "repeat" if device.type == "cuda" else "all"


def resolve_device(config: EngineConfig) -> EngineConfig:
    if config.device != "auto":
        return config
    return dataclasses.replace(config, device="cuda" if torch.cuda.is_available() else "cpu")


def load_dtype(config: EngineConfig) -> str | None:
    """`--dtype`, else the checkpoint's on a GPU, float32 on the CPU (bf16 matmuls are slow)."""
    if config.dtype is not None:
        return config.dtype
    return "float32" if str(config.device).startswith("cpu") else None


def cache_manager(plan: CachePlan, cache: CacheConfig, device: torch.device) -> CacheManager:
    has_state = plan.bytes_per_slot > 0
    return CacheManager(
        plan.num_blocks, plan.num_slots, plan.block_size,
        enable_prefix_caching=cache.enable_prefix_caching,
        checkpoint_stride=cache.state_checkpoint_stride if has_state else 0,
        num_checkpoints=plan.num_checkpoints, checkpoint_policy=checkpoint_policy(cache, device),
    )  # fmt: skip
