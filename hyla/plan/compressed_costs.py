"""DeepSeek-V4's "swa", "csa", "hca" layers in the planner's terms, as the reference path runs them:
a step reads every cached token (roped kv + compressor inputs) and pools the windows again."""

from __future__ import annotations

from hyla.cache.spec import DTYPE_BYTES, compressed_specs, kv_dtype
from hyla.config import COMPRESSED_KINDS, ModelConfig


def layer_bytes_per_token(config: ModelConfig, kind: str) -> int:
    """Cache bytes of one token in one layer of `kind` (every rank holds them whole)."""
    specs = compressed_specs(config, kind, kv_dtype(config))
    return sum(DTYPE_BYTES[s.dtype] * _numel(s.shape) for s in specs)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def read_bytes(config: ModelConfig, kind: str, context: float) -> float:
    return context * layer_bytes_per_token(config, kind)


def flops_per_token(config: ModelConfig, kind: str, context: float) -> float:
    """Attention FLOPs of one token at `context` in one layer (window, entries, CSA indexer)."""
    c = config.compressed
    window = min(context, c.sliding_window)
    if kind == "swa":
        return 4 * c.num_heads * c.head_dim * window
    ratio = c.csa_ratio if kind == "csa" else c.hca_ratio
    entries = context / ratio
    read = min(entries, c.index_topk) if kind == "csa" else entries
    out = 4 * c.num_heads * c.head_dim * (window + read)
    if kind == "csa":
        out += 2 * c.index_n_heads * c.index_head_dim * entries
    return out


def is_compressed(kind: str) -> bool:
    return kind in COMPRESSED_KINDS
