"""Assembling an `LLMEngine` from a checkpoint directory: the device, dtype, tokenizer, model
(or the tensor-parallel executor that loads each rank's slices), vision runtime and warm-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from hyla.config import CacheConfig, ConfigError, EngineConfig
from hyla.engine.startup import TOKENIZER_FILES, load_chat_template
from hyla.engine.warmup import warm_up
from hyla.multimodal.inputs import ImageLimits
from hyla.multimodal.runtime import MultimodalRuntime

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "default_model"


def load_engine(engine_class: Any, path: str | None = None, **overrides: Any) -> Any:
    """An `engine_class` (LLMEngine) over checkpoint directory `path` (HF family or hyla
    layout; None: the embedded default model) and its tokenizer, warmed up
    (`hyla.engine.warmup`). `overrides` are EngineConfig/CacheConfig/SchedulerConfig fields.

    Raises: ConfigError for an unknown option or a `tokenizer` directory without tokenizer
        files; FileNotFoundError for a missing checkpoint.
    """
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
    if config.uses_executor:  # tensor parallel: every rank loads its own slices
        from hyla.distributed.executor import start_executor

        executor = start_executor(directory, config, load_dtype(config))
        limits = ImageLimits(config.limit_mm_per_prompt, config.max_image_pixels)
        # the vision tower on rank 0 only: its rows reach the ranks in the step plan
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
    warm_up(engine)  # before it serves: the first requests compile nothing
    return engine


def load_tokenizer(path: str | Path) -> Any:
    """A transformers tokenizer from directory `path`, or None when it holds no tokenizer files."""
    directory = Path(path)
    if not any((directory / name).exists() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # AutoTokenizer also reads config.json; hyla's own model_type is unknown to transformers,
    # which only warns about it. The tokenizer files alone decide the tokenizer.
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    finally:
        hf_logging.set_verbosity(previous)
    # the engine checks prompt lengths against max_model_len itself (a clear error, or a
    # long prompt it serves): transformers' "Token indices sequence length is longer than the
    # specified maximum ... indexing errors" warning is noise. Marked as given already.
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


def checkpoint_policy(cache: CacheConfig, device: torch.device) -> str:
    """`prefix_checkpoint_policy`, "auto" resolved: "repeat" on CUDA (a state inside a chunk
    costs a split fla call and an eager step there: 2.6x an 8K prefill step's time measured,
    bench/results/gpu_serve_policy_h200.json), "all" elsewhere (nearly free on the CPU)."""
    if cache.prefix_checkpoint_policy != "auto":
        return cache.prefix_checkpoint_policy
    return "repeat" if device.type == "cuda" else "all"


def resolve_device(config: EngineConfig) -> EngineConfig:
    """`config` with device "auto" replaced by "cuda" when torch sees a GPU, else "cpu"."""
    if config.device != "auto":
        return config
    return dataclasses.replace(config, device="cuda" if torch.cuda.is_available() else "cpu")


def load_dtype(config: EngineConfig) -> str | None:
    """`--dtype`, else the checkpoint's dtype on a GPU and float32 on the CPU, where bf16
    matmuls are tens of times slower than fp32 on CPUs without native bf16 units."""
    if config.dtype is not None:
        return config.dtype
    return "float32" if str(config.device).startswith("cpu") else None
