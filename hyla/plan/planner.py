"""`hyla plan MODEL_OR_CONFIG`: which parallel layouts of `num_gpus` GPUs serve a model at a
context and concurrency, ranked, with what binds each one. Reads config.json only.

Ranking: layouts where every requested sequence fits come first, by estimated output tokens/s;
then those that fit fewer sequences, by how many; then those that do not fit at all.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from hyla.config import ConfigError, ModelConfig, QuantizationConfig
from hyla.distributed.sharding import check_parallel
from hyla.models.loader import config_path, load_config
from hyla.plan.costs import ParamSplit, param_split, vision_tower_bytes
from hyla.plan.estimate import Estimate, Workload, estimate
from hyla.plan.gpus import GPUSpec

ESTIMATE_NOTE = (
    "every layout listed is one hyla serve accepts: TPn is --tensor-parallel-size n, EPn "
    "adds --enable-expert-parallel, DPm is m such servers side by side; tensor/expert-parallel "
    "layouts have not been measured on several GPUs yet "
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


def candidate_layouts(cfg: ModelConfig, num_gpus: int) -> tuple[list[tuple[int, int]], list]:
    """(tp, ep) pairs to estimate, and (layout, reason) pairs refused: tp divides num_gpus, ep
    is 1 or tp (expert parallelism runs inside the TP group), and the engine's own check
    (`check_parallel`, which `hyla serve` runs before loading weights) accepts the pair."""
    layouts, refused = [], []
    for tp in (d for d in range(1, num_gpus + 1) if num_gpus % d == 0):
        for ep in [1] if cfg.moe is None or tp == 1 else [1, tp]:
            name = f"TP{tp} DP{num_gpus // tp} EP{ep}"
            try:
                check_parallel(cfg, tp, ep > 1)
            except ConfigError as e:
                refused.append((name, str(e)))
            else:
                layouts.append((tp, ep))
    return layouts, refused


def serve_command(e: Estimate) -> str:
    """The `hyla serve` options of layout `e` (one of its `dp` servers)."""
    flags = f" --tensor-parallel-size {e.tp}" if e.tp > 1 else ""
    return "hyla serve MODEL" + flags + (" --enable-expert-parallel" if e.ep > 1 else "")


def _raw_config(path: str | Path) -> dict:
    raw = json.loads(config_path(path).read_text())
    return raw if isinstance(raw, dict) else {}


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
    `kv_cache_dtype` says otherwise (as the engine's `--dtype` does). Weights are fp8 as the
    loader makes them: the checkpoint's `quantization_config` (whatever `work.weight_dtype`),
    or `work.weight_dtype` "fp8" on a float checkpoint (`--quantization fp8`).

    Raises: ConfigError (bad config.json), FileNotFoundError, ValueError (bad workload).
    """
    cfg = config if config is not None else load_config(path)
    if work.weight_dtype in ("float32", "bfloat16", "float16"):
        cfg = cfg.replace(dtype=work.weight_dtype)
    quantize_floats = None
    if work.weight_dtype == "fp8" and cfg.quantization is None:  # as --quantization fp8
        cfg, quantize_floats = cfg.replace(quantization=QuantizationConfig()), True
    if cfg.quantization is not None:  # the loader keeps the checkpoint's fp8 weights
        work = dataclasses.replace(work, weight_dtype="fp8")
    if kv_cache_dtype is not None:
        cfg = cfg.replace(kv_cache_dtype=kv_cache_dtype)
    raw = _raw_config(path) if config is None else {}
    vision = vision_tower_bytes(raw, cfg.dtype)
    directory = Path(path) if config is None and Path(path).is_dir() else None
    split = param_split(cfg, directory, quantize_floats, vision)
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
