"""Prometheus metrics of one server: request counts, latencies and engine occupancy.

Each app owns its `CollectorRegistry` (no process-global state), so several servers can live in
one process (tests). Latencies are measured at the server, from the moment the HTTP handler
accepted the request: TTFT = first token reaching the event loop; inter-token latency = gap
between successive outputs divided by the tokens they carried. Engine gauges are read from
`AsyncEngine.get_stats()` (a snapshot taken by the engine thread after each step) at scrape time.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
)
_KNOWN_STATS = {
    "num_running": "hyla_num_requests_running",
    "num_waiting": "hyla_num_requests_waiting",
    "num_total_blocks": "hyla_cache_blocks_total",
    "num_free_blocks": "hyla_cache_blocks_free",
    "num_total_slots": "hyla_state_slots_total",
    "num_free_slots": "hyla_state_slots_free",
    "num_cached_checkpoints": "hyla_prefix_cache_checkpoints",
    "cached_checkpoint_bytes": "hyla_prefix_cache_checkpoint_bytes",
    "encoder_cache_entries": "hyla_encoder_cache_entries",
    "encoder_cache_bytes": "hyla_encoder_cache_bytes",
}
# Prefix-cache and encoder counters of EngineStats (monotonic since start), exported as counters.
_COUNTER_STATS = {
    "prefix_cache_queries": (
        "hyla_prefix_cache_queries", "sequences looked up in the prefix cache"),
    "prefix_cache_queried_tokens": (
        "hyla_prefix_cache_queried_tokens", "prompt tokens looked up in the prefix cache"),
    "prefix_cache_hit_tokens": (
        "hyla_prefix_cache_hit_tokens", "prompt tokens served from the prefix cache"),
    "prefix_cache_block_only_tokens": (
        "hyla_prefix_cache_block_only_tokens",
        "prompt tokens whose attention blocks were cached without the linear-state checkpoint "
        "(recomputed: a miss another engine might have served silently wrong)"),
    "prefix_cache_below_block_queries": (
        "hyla_prefix_cache_below_block_queries",
        "sequences with no full block before their last token (nothing reusable)"),
    "prefix_cache_below_stride_queries": (
        "hyla_prefix_cache_below_stride_queries",
        "sequences with no checkpoint stride before their last token (only a tail can hit)"),
    "prefix_cache_checkpoint_saves": (
        "hyla_prefix_cache_checkpoint_saves", "linear-state checkpoints written"),
    "spec_decode_num_drafts": (
        "hyla_spec_decode_num_drafts", "verify steps of one sequence (speculative decoding)"),
    "spec_decode_num_draft_tokens": (
        "hyla_spec_decode_num_draft_tokens", "draft tokens verified"),
    "spec_decode_num_accepted_tokens": (
        "hyla_spec_decode_num_accepted_tokens", "draft tokens accepted"),
    "num_encoded_images": ("hyla_encoder_images", "images run through the vision encoder"),
    "encoder_cache_hits": (
        "hyla_encoder_cache_hits", "image uses served by the encoder cache (no encoding)"),
}


class _EngineCollector:
    """Gauges computed from the engine's stats snapshot on every scrape."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self):  # noqa: ANN201 (prometheus collector protocol)
        stats = self.engine.get_stats()
        values = _numeric_fields(stats)
        for name, metric in _KNOWN_STATS.items():
            if name in values:
                yield _gauge(metric, f"engine stat {name}", values[name])
        yield _gauge("hyla_cache_block_usage_ratio", "fraction of KV-cache blocks in use",
                     _usage(values, "num_total_blocks", "num_free_blocks"))
        yield _gauge("hyla_state_slot_usage_ratio", "fraction of linear-state slots in use",
                     _usage(values, "num_total_slots", "num_free_slots"))
        yield _gauge("hyla_num_requests_in_flight", "requests admitted and not finished",
                     self.engine.num_in_flight())
        for name, (metric, doc) in _COUNTER_STATS.items():
            if name in values:
                yield CounterMetricFamily(metric, doc, value=values[name])
        if "prefix_cache_hit_rate" in values:
            yield _gauge("hyla_prefix_cache_hit_rate", "hit tokens / queried tokens since start",
                         values["prefix_cache_hit_rate"])
        named = {*_KNOWN_STATS, *_COUNTER_STATS, "prefix_cache_hit_rate"}
        for name, value in values.items():
            if name not in named:
                yield _gauge(f"hyla_engine_{name}", f"engine stat {name}", value)
        yield from _step_counters(getattr(stats, "step_stats", None) or {})
        for name, value in (getattr(stats, "tier_stats", None) or {}).items():  # issue 37
            yield _gauge(f"hyla_{name}", f"pinned documents and kv offload tiers: {name}", value)


_STEP_DOCS = {
    "steps": "engine steps launched, by path (decode_graph, mixed_graph, eager)",
    "launch_seconds": "host seconds spent launching steps (forward + sampler), by path",
    "device_seconds": "device seconds the launched steps spanned (CUDA events), by path",
}


def _step_counters(step_stats: dict):  # noqa: ANN202
    for key, by_path in step_stats.items():
        family = CounterMetricFamily(f"hyla_engine_{key}", _STEP_DOCS[key], labels=["path"])
        for path, value in by_path.items():
            family.add_metric([path], value)
        yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _usage(values: dict[str, float], total: str, free: str) -> float:
    n = values.get(total, 0)
    return (n - values.get(free, 0)) / n if n else 0.0


def _numeric_fields(stats: Any) -> dict[str, float]:
    if stats is None:
        return {}
    if dataclasses.is_dataclass(stats):
        items = dataclasses.asdict(stats).items()
    else:
        items = vars(stats).items() if hasattr(stats, "__dict__") else ()
    return {
        k: float(v)
        for k, v in items
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k.isidentifier()
    }


class ServerMetrics:
    """The registry of one app, and helpers the routes call."""

    def __init__(self, engine: Any) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("hyla_http_requests", "HTTP requests by route and status code",
                                ["route", "status"], registry=r)
        self.finished = Counter("hyla_requests_finished", "generation requests by finish reason",
                                ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("hyla_prompt_tokens", "prompt tokens processed", registry=r)
        self.generation_tokens = Counter("hyla_generation_tokens", "tokens generated",
                                         registry=r)
        self.ttft = Histogram("hyla_time_to_first_token_seconds", "time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("hyla_inter_token_latency_seconds", "time between output tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("hyla_e2e_request_latency_seconds", "request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_EngineCollector(engine))
        if hasattr(engine, "metric_collector"):  # replicas: series by replica (hyla/replicas)
            r.register(engine.metric_collector())

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def tracker(self) -> RequestTracker:
        return RequestTracker(self)


class RequestTracker:
    """Latency bookkeeping of one engine request (one prompt, n completions)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.start = time.monotonic()
        self.last_time: float | None = None
        self.num_tokens_of: dict[int, int] = {}  # per completion index
        self.finish_reasons: list[str] = []
        self.is_done = False

    def observe(self, output: Any) -> None:
        """Record a DELTA `RequestOutput` (each token and finish once) as it reaches the event
        loop; TTFT and ITL follow the completion with the most tokens."""
        now = time.monotonic()
        before = max(self.num_tokens_of.values(), default=0)
        for o in output.outputs:
            self.num_tokens_of[o.index] = self.num_tokens_of.get(o.index, 0) + len(o.token_ids)
            if o.finish_reason is not None:
                self.finish_reasons.append(o.finish_reason)
        new = max(self.num_tokens_of.values(), default=0) - before
        if new > 0:
            if self.last_time is None:
                self.metrics.ttft.observe(now - self.start)
                new -= 1
            if new > 0 and self.last_time is not None:
                gap = (now - self.last_time) / new
                for _ in range(new):
                    self.metrics.itl.observe(gap)
            self.last_time = now
        if output.finished:
            self._finish(output, now)

    def close(self) -> None:
        """Call when the route lets go of the request; counts it as aborted if unfinished."""
        if not self.is_done:
            self.is_done = True
            self.metrics.finished.labels("abort").inc()

    def _finish(self, output: Any, now: float) -> None:
        self.is_done = True
        m = self.metrics
        m.e2e.observe(now - self.start)
        m.prompt_tokens.inc(len(output.prompt_token_ids))
        m.generation_tokens.inc(sum(self.num_tokens_of.values()))
        for reason in self.finish_reasons:
            m.finished.labels(reason).inc()
