"""What an engine tells its user at start, and its CPU thread count: a small model runs one
torch thread (the pool's spin and wake cost more than its microsecond ops) unless the environment
sets a count (bench/first_run_cpu.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("hyla")

SMALL_HIDDEN_SIZE = 1024
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_threads(hidden_size: int, env: Mapping[str, str] = os.environ) -> int | None:
    if any(env.get(name) for name in THREAD_ENV_VARS):
        return None
    return 1 if hidden_size <= SMALL_HIDDEN_SIZE else None


def apply_cpu_threads(engine: Any) -> int:
    import torch

    if _device(engine).type == "cpu":
        chosen = cpu_threads(engine.model_config.hidden_size)
        if chosen is not None and torch.get_num_threads() > chosen:
            torch.set_num_threads(chosen)
    return torch.get_num_threads()


def startup_line(engine: Any) -> str:
    import torch

    plan = engine.cache_plan
    device = _device(engine)
    dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
    parts = [
        f"model {engine.model_name!r}",
        f"device {device}",
        f"dtype {dtype}",
        *_precision_parts(engine.model_config),
        f"cache {plan.num_usable_blocks} blocks x {plan.block_size} = "
        f"{plan.num_usable_blocks * plan.block_size} tokens",
        f"{plan.num_usable_slots} state slots",
        f"max_model_len {engine.max_model_len}",
    ]
    if device.type == "cpu":
        parts.append(f"{torch.get_num_threads()} CPU thread(s)")
    return "hyla: " + ", ".join(parts)


def _precision_parts(config: Any) -> list[str]:
    parts = []
    if config.quantization is not None:
        parts.append(f"{config.quantization.method} weights")
    if config.kv_cache_dtype != "auto":
        parts.append(f"kv cache {config.kv_cache_dtype}")
    if config.mamba_ssm_cache_dtype != "float32":
        parts.append(f"recurrent state {config.mamba_ssm_cache_dtype}")
    return parts


def tokenizer_notices(engine: Any) -> list[str]:
    """Warnings a user needs before the first request (no tokenizer or chat template)."""
    tokenizer = engine.tokenizer
    if tokenizer is None:
        return [
            "warning: this model has no tokenizer (no tokenizer.json or tokenizer_config.json "
            "in its directory; pass --tokenizer DIR): text prompts and chat requests fail, "
            "only token-id prompts work"
        ]
    if not getattr(tokenizer, "chat_template", None):
        return [
            "note: the tokenizer has no chat template; chat requests use hyla's fallback "
            "template ('Role: content' lines, then 'Assistant:')"
        ]
    return []


def log_startup(engine: Any) -> None:
    logger.info(startup_line(engine))
    for notice in tokenizer_notices(engine):
        logger.warning(notice)


def _device(engine: Any):
    return next(engine.model.parameters()).device


def load_chat_template(value: str) -> str:
    """`--chat-template` as vLLM reads it: a file, else a template (escapes decoded)."""
    import codecs

    from hyla.config import ConfigError

    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        if not any(c in value for c in "{}\n"):
            raise ConfigError(f"chat_template: {value!r} looks like a file path, but it cannot "
                              f"be read ({e.strerror or e})") from None  # fmt: skip
        return codecs.decode(value, "unicode_escape")
