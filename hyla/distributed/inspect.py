"""`hyla inspect PATH --tensor-parallel-size N`: what one rank holds. Weights scale the stored
bytes by the rank's share of the parameters (both models built on the meta device)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyla.cache.spec import bytes_per_state_slot, bytes_per_token
from hyla.config import ModelConfig
from hyla.distributed.groups import TPGroup
from hyla.distributed.loader import build_rank_model
from hyla.distributed.sharding import check_parallel, rank_config


@dataclass(frozen=True)
class RankReport:
    tensor_parallel_size: int
    expert_parallel: bool
    weight_bytes: int
    cache_bytes_per_token: int
    state_bytes_per_seq: int
    replicated_cache_bytes_per_token: int


def rank_report(
    config: ModelConfig, weight_bytes: int, tp_size: int, expert_parallel: bool
) -> RankReport:
    """Rank 0's share (the ranks differ by vocab padding only). Raises: ConfigError."""
    check_parallel(config.replace(quantization=None), tp_size, expert_parallel)
    plain = config.replace(quantization=None, dtype="float32")
    full = build_rank_model(plain, TPGroup(0, 1), False, "meta")
    local = build_rank_model(plain, TPGroup(0, tp_size), expert_parallel, "meta")
    share = _count(local) / _count(full)
    own = rank_config(config, tp_size, expert_parallel)
    return RankReport(
        tp_size, expert_parallel, round(weight_bytes * share), bytes_per_token(own),
        bytes_per_state_slot(own), _replicated_per_token(own),
    )  # fmt: skip


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _replicated_per_token(config: ModelConfig) -> int:
    """Bytes per token on every rank in full (MLA latent: per token; DSA indexer: all heads)."""
    if not set(config.layer_pattern) & {"mla", "dsa"}:
        return 0
    return bytes_per_token(config)  # all attention layers of these families are MLA/DSA


def format_rank_report(r: RankReport, bytes_fmt) -> str:  # noqa: ANN001
    mode = " + expert parallel" if r.expert_parallel else ""
    lines = [
        f"per rank (tensor parallel {r.tensor_parallel_size}{mode}):",
        f"  weights       ~{bytes_fmt(r.weight_bytes)}",
        f"  kv cache      {bytes_fmt(r.cache_bytes_per_token)} per token"
        + (" (MLA latent / DSA index keys: replicated on every rank)"
           if r.replicated_cache_bytes_per_token else ""),
        f"  linear state  {bytes_fmt(r.state_bytes_per_seq)} per sequence (own heads only)",
    ]  # fmt: skip
    return "\n".join(lines)
