"""`hyla inspect PATH`: what a model is and costs without loading weights: parameters counted on
a meta-device model, cache costs from `hyla.cache.spec`."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from hyla.cache.spec import bytes_per_state_slot, bytes_per_token, kv_dtype
from hyla.config import ModelConfig
from hyla.models.checkpoint import plan_checkpoint, targets_of
from hyla.models.loader import DTYPES, build_empty_model, checkpoint_files, config_path, load_config
from hyla.models.quantization import choose_fp8, convert_modules


@dataclass(frozen=True)
class InspectReport:
    """`num_active_params`: non-expert weights, shared and `num_experts_per_tok` routed experts;
    `cache_bytes_per_token`: attention-like layers; `state_bytes_per_seq`: linear layers."""

    path: str
    config: ModelConfig
    layer_pattern: str
    ffn_pattern: str
    layer_counts: tuple[tuple[str, int], ...]
    num_params: int
    num_active_params: int
    weight_bytes: int
    cache_dtype: str
    cache_bytes_per_token: int
    state_bytes_per_seq: int
    checkpoint_files: int
    checkpoint_bytes: int


def compact_pattern(kinds: Sequence[str]) -> str:
    """Shortest run-length form of a per-layer list, e.g. `[kda, kda, kda, mla] x 8`: a DP where
    a repeated block costs its length + 1.5; ties go to the earliest first block."""
    n = len(kinds)
    # best[i] = (cost, index of the first block relative to i, rendered parts) for kinds[i:]
    best: list[tuple[float, float, list[str]]] = [(0.0, float("inf"), [])] * (n + 1)
    for i in range(n - 1, -1, -1):
        cost, first, parts = best[i + 1]
        options = [(1 + cost, 1 + first, [kinds[i], *parts])]
        for p in range(1, (n - i) // 2 + 1):
            block = list(kinds[i : i + p])
            reps = 1
            while list(kinds[i + (reps * p) : i + (reps + 1) * p]) == block:
                reps += 1
            if reps >= 2:
                cost, _, parts = best[i + reps * p]
                text = f"[{', '.join(block)}] x {reps}"
                options.append((p + 1.5 + cost, 0, [text, *parts]))
        best[i] = min(options, key=lambda o: (o[0], o[1]))
    return ", ".join(best[0][2])


def count_params(config: ModelConfig) -> tuple[int, int]:
    """(total, active per token) parameter counts of the model `config` describes."""
    model = build_empty_model(config.replace(dtype="float32"), "meta")
    total = sum(p.numel() for p in model.parameters())
    inactive = 0
    if config.moe is not None:
        keep = config.moe.num_experts_per_tok / config.moe.num_experts
        for layer in model.layers:
            experts = getattr(layer.mlp, "experts", None)
            if experts is not None:
                routed = sum(p.numel() for p in experts.parameters())
                inactive += routed - round(routed * keep)
    return total, total - inactive


def stored_model(config: ModelConfig, path: Path | None, quantize_floats: bool | None = None
                 ) -> nn.Module:  # fmt: skip
    """The meta-device model with weights as the loader keeps them (fp8 where stored so, else
    `config.dtype`); `quantize_floats` (default: no checkpoint) makes every candidate fp8."""
    model = build_empty_model(config, "meta")
    if config.quantization is not None:
        files = list(path.glob("*.safetensors")) if path is not None and path.is_dir() else []
        stored: set[str] = set()
        if files and not quantize_floats:
            targets, aliases = targets_of(model)
            entries = plan_checkpoint(config, targets, aliases, checkpoint_files(path))
            stored = {p.target for e in entries if e.scale is not None for p in e.placements}
        quantize = not files if quantize_floats is None else quantize_floats
        chosen = choose_fp8(model, stored, quantize_floats=quantize)
        convert_modules(model, chosen, DTYPES[config.dtype], "meta")
    return model


def stored_weight_bytes(config: ModelConfig, path: Path) -> int:
    return sum(p.numel() * p.element_size() for p in stored_model(config, path).parameters())


def _checkpoint_size(path: Path) -> tuple[int, int]:
    if not path.is_dir():
        return 0, 0
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = set(json.loads(index.read_text())["weight_map"].values())
        files = [path / n for n in names if (path / n).is_file()]
    else:
        files = list(path.glob("*.safetensors"))
    return len(files), sum(f.stat().st_size for f in files)


def inspect_model(path: str | Path, serve_dtype: str | None = None) -> InspectReport:
    """Inspect a checkpoint directory or config.json without allocating weights; cache figures in
    `serve_dtype` (None: the checkpoint's). Raises ConfigError, FileNotFoundError."""
    path = Path(path)
    config = load_config(path)
    served = config if serve_dtype is None else config.replace(dtype=serve_dtype)
    total, active = count_params(config)
    num_files, size = _checkpoint_size(path)
    return InspectReport(
        path=str(config_path(path).parent if path.is_dir() else path),
        config=config,
        layer_pattern=compact_pattern(config.layer_pattern),
        ffn_pattern=compact_pattern(config.ffn_pattern),
        layer_counts=tuple(sorted(Counter(config.layer_pattern).items())),
        num_params=total,
        num_active_params=active,
        weight_bytes=stored_weight_bytes(config, path),
        cache_dtype=kv_dtype(served),
        cache_bytes_per_token=bytes_per_token(served),
        state_bytes_per_seq=bytes_per_state_slot(served),
        checkpoint_files=num_files,
        checkpoint_bytes=size,
    )


def _count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(int(n))


def _bytes(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _precision(config: ModelConfig) -> str:
    quant = config.quantization
    if quant is None:
        return config.dtype
    block = "per channel" if quant.weight_block_size is None else "x".join(
        map(str, quant.weight_block_size))  # fmt: skip
    return f"fp8 e4m3 (scales {block}) + {config.dtype}"


def format_report(report: InspectReport) -> str:
    c = report.config
    counts = ", ".join(f"{kind} {n}" for kind, n in report.layer_counts)
    ffn = report.ffn_pattern
    if c.moe is not None:
        shared = f" + {c.moe.num_shared_experts} shared" if c.moe.num_shared_experts else ""
        ffn += f"  ({c.moe.num_experts} experts, top {c.moe.num_experts_per_tok}{shared})"
    ckpt = "none"
    if report.checkpoint_files:
        n = report.checkpoint_files
        ckpt = f"{n} safetensors file{'s' * (n != 1)}, {_bytes(report.checkpoint_bytes)}"
    full = report.cache_bytes_per_token * c.max_context_len + report.state_bytes_per_seq
    rows = [
        ("model", f"{c.architecture}  ({report.path})"),
        ("layers", f"{c.num_layers}: {report.layer_pattern}  ({counts})"),
        ("ffn", ffn),
        ("hidden", f"{c.hidden_size}, vocab {c.vocab_size}, tied embeddings: "
                   f"{'yes' if c.tie_word_embeddings else 'no'}"),
        ("parameters", f"{_count(report.num_params)} total, "
                       f"{_count(report.num_active_params)} active per token"),
        ("weights", f"{_bytes(report.weight_bytes)} in {_precision(c)}; checkpoint: {ckpt}"),
        ("kv cache", f"{_bytes(report.cache_bytes_per_token)} per token "
                     f"({report.cache_dtype}, attention/DSA layers)"),
        ("linear state", f"{_bytes(report.state_bytes_per_seq)} per sequence "
                         f"(recurrent {c.mamba_ssm_cache_dtype} + conv, any length)"),
        ("context", f"{c.max_context_len:,} tokens max; one full-length sequence caches "
                    f"{_bytes(full)}"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)
