"""`hyla plan` checked at full size on the meta device: build a layout's rank model and caches with
the engine's own sharding and compare one rank's bytes with the plan's (refused layouts too)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from hyla.config import ConfigError
from hyla.distributed.groups import TPGroup
from hyla.distributed.loader import build_rank_model
from hyla.distributed.sharding import check_parallel
from hyla.forward_batch import allocate_caches
from hyla.models.loader import DTYPES
from hyla.models.quantization import choose_fp8, convert_modules
from hyla.plan.estimate import Estimate, Workload, estimate
from hyla.plan.gpus import GPUSpec
from hyla.plan.planner import plan


@dataclass(frozen=True)
class RankBytes:
    weight_bytes: int
    cache_bytes_per_token: int
    state_bytes_per_seq: int


def meta_rank_bytes(config, tp: int, ep: bool, vision_bytes: int = 0) -> RankBytes:  # noqa: ANN001
    """Rank 0's bytes of `config` (as served) under TP `tp` (+ EP), built on the meta device."""
    model = build_rank_model(config, TPGroup(0, tp), ep, "meta")
    if config.quantization is not None:  # no checkpoint: every fp8 candidate
        chosen = choose_fp8(model, set(), quantize_floats=True)
        convert_modules(model, chosen, DTYPES[config.dtype], "meta")
    weights = sum(t.numel() * t.element_size() for t in model.state_dict(keep_vars=True).values())
    caches = allocate_caches(model.config, 1, 1, 1, "meta")
    paged = slot = 0
    for layer, specs in zip(caches, _per_token_names(model.config), strict=True):
        for name, t in layer.items():
            if name in specs:
                paged += t.numel() * t.element_size()
            else:
                slot += t.numel() * t.element_size()
    return RankBytes(weights + vision_bytes, paged, slot)


def _per_token_names(config) -> list[set[str]]:  # noqa: ANN001
    from hyla.cache.spec import layer_cache_specs

    return [{s.name for s in layer_cache_specs(config, i) if s.per == "token"}
            for i in range(config.num_layers)]  # fmt: skip


def _rel(plan_value: float, built: float) -> float:
    return 0.0 if plan_value == built else abs(plan_value - built) / max(abs(built), 1)


def check_layout(
    path: str | Path, gpu: GPUSpec, work: Workload, tp: int, ep: int,
    kv_cache_dtype: str | None = None,
) -> dict:  # fmt: skip
    """Layout (tp, ep)'s planned per-rank bytes against the meta build's, as a JSON row."""
    report = plan(path, gpu, work, kv_cache_dtype=kv_cache_dtype)
    cfg, split = report.config, report.split
    try:
        check_parallel(cfg, tp, ep > 1)
        refused = None
    except ConfigError as e:
        refused = str(e)
    est: Estimate = estimate(cfg, split, gpu, report.work, tp, ep)
    built = meta_rank_bytes(cfg, tp, ep > 1, split.vision_bytes)
    planned = RankBytes(est.weight_bytes, est.cache_bytes_per_token, est.state_bytes_per_seq)
    rel = {k: _rel(getattr(planned, k), getattr(built, k)) for k in asdict(built)}
    return {
        "model": cfg.architecture, "weights": report.work.weight_dtype,
        "cache": cfg.kv_cache_dtype if cfg.kv_cache_dtype != "auto" else cfg.dtype,
        "layout": f"TP{tp} DP{work.num_gpus // tp} EP{ep}", "engine_refuses": refused,
        "plan": asdict(planned), "meta": asdict(built), "rel_err": rel,
        "max_rel_err": max(rel.values()), "fits": est.fits, "max_seqs": est.max_seqs,
        "context": work.context, "binding": est.binding,
    }  # fmt: skip


def write_config(raw: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw))
    return directory


FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
       "weight_block_size": [128, 128]}  # fmt: skip

# (name, transformers class, extra config.json fields, weight dtype, cache dtype, (tp, ep)s)
CASES = (
    ("Kimi-Linear-48B", "KimiLinearConfig", {}, "bfloat16", None, ((1, 1), (8, 8))),
    ("DeepSeek-V3.2 fp8", "DeepseekV32Config", {"quantization_config": FP8}, "fp8", "fp8",
     ((8, 8), (8, 1))),
    ("Qwen3-Next-80B", "Qwen3NextConfig", {}, "bfloat16", None, ((4, 1), (8, 8))),
    ("Qwen3.5", "Qwen3_5Config", {}, "bfloat16", None, ((1, 1), (4, 1))),
    ("GLM-5.3-Flash bf16", "Glm5NextConfig", {}, "bfloat16", None, ((8, 8), (8, 1))),
    ("GLM-5.3-Flash text bf16", "Glm5NextConfig", {"text_only": True}, "bfloat16", None,
     ((8, 8), (8, 1))),
    ("GLM-5.3-Flash fp8", "Glm5NextConfig", {}, "fp8", "fp8", ((8, 8),)),
)  # fmt: skip


def default_config(class_name: str, extra: dict) -> dict:
    """config.json of transformers' `class_name` at defaults, named as a release names it."""
    import transformers

    cls = getattr(transformers, class_name)
    raw, extra = cls().to_dict(), dict(extra)
    family = raw["model_type"]
    if extra.pop("text_only", False):
        raw = {**raw["text_config"], "model_type": family}
    raw["architectures"] = [_architecture(family)]
    return {**raw, "torch_dtype": "bfloat16", **extra}


def _architecture(model_type: str) -> str:
    return {"kimi_linear": "KimiLinearForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM",
            "qwen3_next": "Qwen3NextForCausalLM",
            "qwen3_5": "Qwen3_5ForConditionalGeneration",
            "glm5_next": "Glm5NextForConditionalGeneration"}[model_type]  # fmt: skip
