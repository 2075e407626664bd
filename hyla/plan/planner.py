"""`hyla plan MODEL_OR_CONFIG`: which parallel layouts of `num_gpus` GPUs serve a model at a
context and concurrency, ranked, with what binds each one. Reads config.json only.

Ranking: layouts where every requested sequence fits come first, by estimated output tokens/s;
then those that fit fewer sequences, by how many; then those that do not fit at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hyla.config import ModelConfig
from hyla.models.loader import config_path, load_config
from hyla.plan.costs import ParamSplit, param_split
from hyla.plan.estimate import Estimate, Workload, estimate
from hyla.plan.gpus import GPUSpec

ESTIMATE_NOTE = (
    "tensor/expert-parallel layouts are estimates: hyla runs them (--tensor-parallel-size) "
    "but has not measured them on several GPUs yet "
    "(roofline: ideal bandwidth and FLOPs; measured steps are slower, see "
    "bench/results/plan_vs_measured.json)"
)


@dataclass(frozen=True)
class PlanReport:
    """Every layout's estimate, best first, plus the layouts refused and why."""

    path: str
    config: ModelConfig
    gpu: GPUSpec
    work: Workload
    split: ParamSplit
    layouts: tuple[Estimate, ...]
    refused: tuple[tuple[str, str], ...]


def _head_counts(cfg: ModelConfig) -> dict[str, int]:
    heads = {}
    if cfg.mla is not None:
        heads["mla.num_heads"] = cfg.mla.num_heads
    if cfg.gqa is not None:
        heads["gqa.num_heads"] = cfg.gqa.num_heads
    if cfg.linear is not None:
        heads["linear.num_v_heads"] = cfg.linear.num_v_heads
        heads["linear.num_k_heads"] = cfg.linear.num_k_heads
    return heads


def candidate_layouts(cfg: ModelConfig, num_gpus: int) -> tuple[list[tuple[int, int]], list]:
    """(tp, ep) pairs to estimate, and (layout, reason) pairs refused: tp must divide num_gpus
    and every head count; ep is 1 or num_gpus and must divide num_experts."""
    layouts, refused = [], []
    eps = [1] if cfg.moe is None or num_gpus == 1 else [1, num_gpus]
    for tp in (d for d in range(1, num_gpus + 1) if num_gpus % d == 0):
        bad = [f"{k}={v}" for k, v in _head_counts(cfg).items() if v % tp]
        for ep in eps:
            name = f"TP{tp} DP{num_gpus // tp} EP{ep}"
            if bad:
                refused.append((name, f"tp {tp} does not divide {', '.join(bad)}"))
            elif ep > 1 and cfg.moe.num_experts % ep:
                refused.append((name, f"ep {ep} does not divide {cfg.moe.num_experts} experts"))
            else:
                layouts.append((tp, ep))
    return layouts, refused


def _rank_key(e: Estimate, concurrency: int) -> tuple:
    return (not e.fits, e.max_seqs < concurrency, -e.output_tokens_per_s, -e.max_seqs, e.tp)


def plan(
    path: str | Path,
    gpu: GPUSpec,
    work: Workload,
    *,
    kv_cache_dtype: str | None = None,
    config: ModelConfig | None = None,
) -> PlanReport:
    """Plan `work` on `gpu` for the model at `path` (checkpoint dir or config.json). A float
    `work.weight_dtype` is the model's dtype too, so the cache follows it unless
    `kv_cache_dtype` says otherwise (as the engine's `--dtype` does).

    Raises: ConfigError (bad config.json), FileNotFoundError, ValueError (bad workload).
    """
    cfg = config if config is not None else load_config(path)
    if work.weight_dtype in ("float32", "bfloat16", "float16"):
        cfg = cfg.replace(dtype=work.weight_dtype)
    if kv_cache_dtype is not None:
        cfg = cfg.replace(kv_cache_dtype=kv_cache_dtype)
    split = param_split(cfg)
    layouts, refused = candidate_layouts(cfg, work.num_gpus)
    estimates = sorted(
        (estimate(cfg, split, gpu, work, tp, ep) for tp, ep in layouts),
        key=lambda e: _rank_key(e, work.concurrency),
    )
    shown = str(config_path(path)) if config is None else str(path)
    return PlanReport(
        path=shown,
        config=cfg,
        gpu=gpu,
        work=work,
        split=split,
        layouts=tuple(estimates),
        refused=tuple(refused),
    )
