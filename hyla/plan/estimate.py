"""Roofline estimates of one layout (`tp` ranks per server, `dp` servers, `ep` 1 or tp): memory
per GPU, sequences that fit, TTFT, TPOT; a step is max(bytes / HBM bw, FLOPs / peak) + comm."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hyla.cache.spec import DTYPE_BYTES
from hyla.config import ModelConfig
from hyla.plan.costs import (
    ParamSplit,
    attention_flops,
    attention_read_bytes,
    cache_bytes_per_token,
    prefill_attention_flops,
    state_bytes_per_seq,
)
from hyla.plan.gpus import GPUSpec

COLLECTIVE_LATENCY_S = 8e-6  # one NVLink all-reduce / all-to-all of a decode-sized message


@dataclass(frozen=True)
class Workload:
    num_gpus: int
    context: int
    concurrency: int
    weight_dtype: str
    memory_fraction: float = 0.9
    reserve_bytes: int = 2 << 30

    def __post_init__(self) -> None:
        for name in ("num_gpus", "context", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.weight_dtype not in DTYPE_BYTES:
            raise ValueError(f"weight_dtype: {self.weight_dtype!r} not in {tuple(DTYPE_BYTES)}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction: must be in (0, 1], got {self.memory_fraction}")


@dataclass(frozen=True)
class Estimate:
    """Per GPU unless named; `max_seqs` counts all replicas; `binding`: the limiting constraint."""

    tp: int
    dp: int
    ep: int
    weight_bytes: int
    cache_bytes_per_token: int
    state_bytes_per_seq: int
    free_bytes: int
    max_seqs: int
    batch_per_replica: int
    ttft_s: float
    tpot_s: float
    tpot_terms: dict[str, float]
    fits: bool
    binding: str

    @property
    def output_tokens_per_s(self) -> float:
        if not self.fits or self.tpot_s <= 0:
            return 0.0
        return self.batch_per_replica * self.dp / self.tpot_s


def expected_experts_hit(num_experts: int, top_k: int, num_tokens: float) -> float:
    """Expected distinct experts a layer reads for `num_tokens` tokens routed uniformly."""
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


def _expert_step_bytes(cfg: ModelConfig, split: ParamSplit, tokens: float, shards: int) -> float:
    if cfg.moe is None or split.experts == 0:
        return 0.0
    e, k = cfg.moe.num_experts, cfg.moe.num_experts_per_tok
    per_expert = split.experts_bytes / (e * split.num_moe_layers)
    return expected_experts_hit(e, k, tokens) * split.num_moe_layers * per_expert / shards


def _rank_dense_bytes(split: ParamSplit, tp: int) -> float:
    return split.replicated_bytes + (split.dense_bytes - split.replicated_bytes) / tp


def _active_matmul_params(cfg: ModelConfig, split: ParamSplit) -> float:
    head = cfg.vocab_size * cfg.hidden_size
    routed = 0.0
    if cfg.moe is not None:
        routed = split.experts * cfg.moe.num_experts_per_tok / cfg.moe.num_experts
    return split.dense + head + routed


def _comm_s(cfg: ModelConfig, gpu: GPUSpec, tokens: float, tp: int, ep: int, n: int) -> float:
    """One replica's forward's collectives: 2 TP all-reduces per layer, EP all-to-all per MoE."""
    act = tokens * cfg.hidden_size * 2
    time = 0.0
    if tp > 1:
        per = COLLECTIVE_LATENCY_S + 2 * (tp - 1) / tp * act / gpu.link_bw
        time += 2 * cfg.num_layers * per
    if ep > 1 and cfg.moe is not None:
        sent = act / tp * cfg.moe.num_experts_per_tok * (ep - 1) / ep
        time += 2 * cfg.ffn_pattern.count("moe") * (COLLECTIVE_LATENCY_S + sent / gpu.link_bw)
    return time


def tpot_terms(
    cfg: ModelConfig, split: ParamSplit, gpu: GPUSpec, work: Workload, tp: int, ep: int, batch: int
) -> dict[str, float]:
    """Seconds of one decode step of `batch` per replica: `memory`, `compute`, `comm`."""
    head = _rank_dense_bytes(split, tp) + split.head_bytes / tp
    experts = _expert_step_bytes(cfg, split, batch, ep if ep > 1 else tp)
    cache = batch * attention_read_bytes(cfg, work.context, tp)
    state = 2 * batch * state_bytes_per_seq(cfg, tp)
    flops = batch * (2 * _active_matmul_params(cfg, split) + attention_flops(cfg, work.context))
    return {
        "memory": (head + experts + cache + state) / gpu.memory_bw,
        "compute": flops / tp / gpu.flops(work.weight_dtype),
        "comm": _comm_s(cfg, gpu, batch, tp, ep, work.num_gpus),
    }


def ttft_s(
    cfg: ModelConfig, split: ParamSplit, gpu: GPUSpec, work: Workload, tp: int, ep: int
) -> float:
    """Seconds to prefill one `work.context` prompt on one replica."""
    t = work.context
    flops = 2 * _active_matmul_params(cfg, split) * t + prefill_attention_flops(cfg, t)
    reads = _rank_dense_bytes(split, tp) + split.embedding_bytes / tp
    reads += _expert_step_bytes(cfg, split, t, ep if ep > 1 else tp)
    compute = flops / tp / gpu.flops(work.weight_dtype)
    return max(compute, reads / gpu.memory_bw) + _comm_s(cfg, gpu, t, tp, ep, work.num_gpus)


def estimate(
    cfg: ModelConfig, split: ParamSplit, gpu: GPUSpec, work: Workload, tp: int, ep: int
) -> Estimate:
    dp = work.num_gpus // tp
    weights = split.rank_weight_bytes(tp, ep)
    per_token, state = cache_bytes_per_token(cfg, tp), state_bytes_per_seq(cfg, tp)
    free = int(gpu.memory * work.memory_fraction) - work.reserve_bytes - weights
    per_seq = per_token * work.context + state
    max_seqs = dp * (max(free, 0) // per_seq if per_seq else work.concurrency)
    batch = max(1, math.ceil(min(work.concurrency, max_seqs) / dp))
    terms = tpot_terms(cfg, split, gpu, work, tp, ep, batch)
    tpot = max(terms["memory"], terms["compute"]) + terms["comm"]
    fits, binding = _binding(free, weights, per_seq, max_seqs, work, terms)
    return Estimate(tp=tp, dp=dp, ep=ep, weight_bytes=weights, cache_bytes_per_token=per_token,
                    state_bytes_per_seq=state, free_bytes=free, max_seqs=max_seqs,
                    batch_per_replica=batch, ttft_s=ttft_s(cfg, split, gpu, work, tp, ep),
                    tpot_s=tpot, tpot_terms=terms, fits=fits, binding=binding)  # fmt: skip


def _binding(
    free: int, weights: int, per_seq: int, max_seqs: int, work: Workload, terms: dict[str, float]
) -> tuple[bool, str]:
    gib = 1 << 30
    if free <= 0:
        return False, f"memory: weights {weights / gib:.1f} GiB/GPU leave no room for the cache"
    if max_seqs < 1:
        return False, (
            f"memory: one sequence at {work.context:,} tokens needs "
            f"{per_seq / gib:.1f} GiB/GPU, {free / gib:.1f} GiB free"
        )
    if max_seqs < work.concurrency:
        return True, f"cache memory: {max_seqs} of {work.concurrency} sequences fit"
    name = max(terms, key=lambda k: terms[k])
    words = {"memory": "HBM bandwidth", "compute": "compute", "comm": "interconnect"}
    return True, f"{words[name]} (decode step)"
