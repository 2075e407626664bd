"""`hyla plan MODEL_OR_CONFIG`: the parallel layouts of `num_gpus` GPUs for a context and
concurrency from config.json alone, ranked: all sequences fit (by tokens/s), fewer fit, none."""

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
    """(tp, ep) pairs `check_parallel` accepts (tp | num_gpus, ep 1 or tp), and refused ones."""
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
    """Plan `work` on `gpu` for the model at `path`; a float `weight_dtype` is the model's (and the
    cache's unless `kv_cache_dtype`). Raises ConfigError, FileNotFoundError, ValueError."""
    cfg = config if config is not None else load_config(path)
    if work.weight_dtype in ("float32", "bfloat16", "float16"):
        cfg = cfg.replace(dtype=work.weight_dtype)
    quantize_floats = None
    if work.weight_dtype == "fp8" and cfg.quantization is None:  # as --quantization fp8
        cfg, quantize_floats = cfg.replace(quantization=QuantizationConfig()), True
    if cfg.quantization is not None:
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
