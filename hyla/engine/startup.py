"""What an engine tells its user at start, and the CPU thread count it runs with.

Threads: torch's default intra-op pool (one thread per core, OpenMP) makes a small model slower
on the CPU, not faster: each op of a small model is microseconds of work, and the pool's
threads spin, wake and wait on every op, which on a 2-core machine shared with any other busy
process costs more than the op (the embedded 11.7M model generated 64 tokens in 25-62 s with
2 threads and 9 s with one; bench/first_run_cpu.py measures it). So a CPU engine over a model
of hidden size up to `SMALL_HIDDEN_SIZE` runs one torch thread unless the user chose a count in
the environment (OMP_NUM_THREADS or MKL_NUM_THREADS; a `torch.set_num_threads` call after the
engine is built also wins).
"""

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
    """The torch thread count a CPU engine should use, or None to keep torch's (a model of
    hidden size above `SMALL_HIDDEN_SIZE`, or a count the user set in the environment)."""
    if any(env.get(name) for name in THREAD_ENV_VARS):
        return None
    return 1 if hidden_size <= SMALL_HIDDEN_SIZE else None


def apply_cpu_threads(engine: Any) -> int:
    """Set torch's thread count for `engine` (a CPU engine, see the module docstring); returns
    the count in use."""
    import torch

    if _device(engine).type == "cpu":
        chosen = cpu_threads(engine.model_config.hidden_size)
        if chosen is not None and torch.get_num_threads() > chosen:
            torch.set_num_threads(chosen)
    return torch.get_num_threads()


def startup_line(engine: Any) -> str:
    """One line: model, device, dtype (and fp8 weights, a cache dtype other than the model's),
    KV cache blocks and tokens, state slots, CPU threads."""
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
    """What `--quantization` / `--kv-cache-dtype` / `--mamba-ssm-cache-dtype` changed."""
    parts = []
    if config.quantization is not None:
        parts.append(f"{config.quantization.method} weights")
    if config.kv_cache_dtype != "auto":
        parts.append(f"kv cache {config.kv_cache_dtype}")
    if config.mamba_ssm_cache_dtype != "float32":
        parts.append(f"recurrent state {config.mamba_ssm_cache_dtype}")
    return parts


def tokenizer_notices(engine: Any) -> list[str]:
    """Warnings a user needs before the first request: no tokenizer (text prompts and chat will
    fail), or no chat template (chat uses hyla's fallback template)."""
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
    """Log `startup_line` and `tokenizer_notices` at INFO / WARNING (the library's way; the
    CLI prints them)."""
    logger.info(startup_line(engine))
    for notice in tokenizer_notices(engine):
        logger.warning(notice)


def _device(engine: Any):
    return next(engine.model.parameters()).device


def load_chat_template(value: str) -> str:
    """`--chat-template` as vLLM reads it: the file at `value`, else `value` itself when it
    reads as a Jinja template (it holds `{`, `}` or a newline; backslash escapes such as `\\n`
    are decoded). Raises ConfigError for what looks like a path but cannot be read."""
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
