"""`EngineStats`: what `LLMEngine.get_stats` reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hyla.engine.kv_offload import tier_stats
from hyla.spec.decoder import spec_stats


@dataclass
class EngineStats:
    """Queue (in requests) and cache occupancy; prefix counters since start. A
    `prefix_cache_block_only_tokens` token had its blocks cached but not the linear-state
    checkpoint: restoring the blocks alone would give silently wrong output."""

    num_running: int
    num_waiting: int
    num_total_blocks: int
    num_free_blocks: int
    num_total_slots: int
    num_free_slots: int
    num_running_seqs: int = 0
    num_waiting_seqs: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    prefix_cache_hit_rate: float = 0.0
    prefix_cache_block_only_tokens: int = 0
    num_cached_blocks: int = 0
    num_total_checkpoints: int = 0
    num_cached_checkpoints: int = 0
    cached_checkpoint_bytes: int = 0
    prefix_cache_below_block_queries: int = 0
    prefix_cache_below_stride_queries: int = 0
    prefix_cache_checkpoint_saves: int = 0
    encoder_cache_entries: int = 0
    encoder_cache_bytes: int = 0
    num_encoded_images: int = 0
    encoder_cache_hits: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_acceptance_rate: float = 0.0
    step_stats: dict = field(default_factory=dict)
    tier_stats: dict = field(default_factory=dict)


def engine_stats(engine: Any) -> EngineStats:
    """A snapshot of `engine`; the caller holds its lock."""
    running = {engine.requests.owner[r.request_id].request_id for r in engine.scheduler.running}
    waiting = [g for g in engine.requests.groups.values() if g.request_id not in running]
    plan, cache, scheduler = engine.cache_plan, engine.cache, engine.scheduler
    return EngineStats(
        num_running=len(running),
        num_waiting=sum(1 for g in waiting if not g.is_finished),
        num_total_blocks=plan.num_usable_blocks,
        num_free_blocks=cache.num_free_blocks,
        num_total_slots=plan.num_usable_slots,
        num_free_slots=cache.num_free_slots,
        num_running_seqs=scheduler.num_running,
        num_waiting_seqs=scheduler.num_waiting,
        num_preemptions=scheduler.num_preemptions,
        **_prefix_stats(engine),
        **_encoder_stats(engine),
        **spec_stats(engine.spec),
        step_stats=engine.step_stats.snapshot(),
        tier_stats=tier_stats(cache),
    )


def _encoder_stats(engine: Any) -> dict[str, Any]:
    if engine.multimodal is None:
        return {}
    cache = engine.multimodal.cache
    return dict(
        encoder_cache_entries=cache.num_entries,
        encoder_cache_bytes=cache.num_bytes,
        num_encoded_images=cache.stats.num_encoded_images,
        encoder_cache_hits=cache.stats.num_hits,
    )


def _prefix_stats(engine: Any) -> dict[str, Any]:
    prefix = engine.cache.prefix
    if prefix is None:
        return {}
    s = prefix.stats
    return dict(
        prefix_cache_queries=s.num_queries,
        prefix_cache_queried_tokens=s.num_queried_tokens,
        prefix_cache_hit_tokens=s.num_hit_tokens,
        prefix_cache_hit_rate=s.hit_rate,
        prefix_cache_block_only_tokens=s.num_block_only_tokens,
        num_cached_blocks=engine.cache.block_pool.num_cached_blocks,
        num_total_checkpoints=prefix.checkpoints.num_checkpoints,
        num_cached_checkpoints=len(prefix.checkpoints.cached),
        cached_checkpoint_bytes=len(prefix.checkpoints.cached) * engine.cache_plan.bytes_per_slot,
        prefix_cache_below_block_queries=s.num_below_block_queries,
        prefix_cache_below_stride_queries=s.num_below_stride_queries,
        prefix_cache_checkpoint_saves=s.num_checkpoint_saves,
    )
