"""Per-replica series (label `replica`) for /metrics, and the /health answer of a replica set."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_REPLICA_STATS = {
    "num_running": ("hyla_replica_num_requests_running", "requests running on the replica"),
    "num_waiting": ("hyla_replica_num_requests_waiting", "requests waiting on the replica"),
    "num_free_blocks": ("hyla_replica_cache_blocks_free", "free KV-cache blocks"),
    "num_free_slots": ("hyla_replica_state_slots_free", "free linear-state slots"),
    "num_cached_checkpoints": ("hyla_replica_prefix_cache_checkpoints", "cached checkpoints"),
}
_REPLICA_COUNTERS = {
    "prefix_cache_queried_tokens": (
        "hyla_replica_prefix_cache_queried_tokens",
        "prompt tokens looked up in the prefix cache",
    ),
    "prefix_cache_hit_tokens": (
        "hyla_replica_prefix_cache_hit_tokens",
        "prompt tokens served from the prefix cache",
    ),
}


class ReplicaCollector:
    def __init__(self, client: Any) -> None:
        self.client = client

    def collect(self):  # noqa: ANN201 (prometheus collector protocol)
        client, router = self.client, self.client.router
        n = len(router.views)
        yield _gauges("hyla_replica_up", "1 while the replica serves, 0 while it is down",
                      [float(v.is_alive) for v in router.views])  # fmt: skip
        yield _gauges("hyla_replica_load_tokens",
                      "tokens of the replica's running and waiting requests (router's view)",
                      [router.load(i) for i in range(n)])  # fmt: skip
        yield _gauges("hyla_replica_num_requests_open", "requests routed there and not finished",
                      [v.num_open for v in router.views])  # fmt: skip
        stats = client.stats
        for name, (metric, doc) in _REPLICA_STATS.items():
            yield _gauges(metric, doc, [getattr(s, name, 0) if s else 0 for s in stats])
        for name, (metric, doc) in _REPLICA_COUNTERS.items():
            yield _counters(metric, doc, [getattr(s, name, 0) if s else 0 for s in stats])
        yield _counters("hyla_replica_restarts", "times the replica came back after dying",
                        client.restarts)  # fmt: skip
        yield _counters("hyla_router_predicted_hit_tokens",
                        "prefix-cache hit tokens the router predicted for its choices",
                        router.predicted_hit_tokens)  # fmt: skip
        decisions = CounterMetricFamily(
            "hyla_router_decisions", "routing decisions by replica and rule (prefix, "
            "least_loaded, capped: a prefix pick over the load cap, round_robin)",
            labels=["replica", "reason"],
        )  # fmt: skip
        for (replica, reason), count in sorted(router.decisions.items()):
            decisions.add_metric([str(replica), reason], count)
        yield decisions


def _gauges(name: str, doc: str, values: list[float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["replica"])
    for i, value in enumerate(values):
        family.add_metric([str(i)], value)
    return family


def _counters(name: str, doc: str, values: list[float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["replica"])
    for i, value in enumerate(values):
        family.add_metric([str(i)], value)
    return family


def health(replicas: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body): 200 "ok", 200 "degraded" (some down), 503 "unavailable" (all down)."""
    up = sum(r["status"] == "ok" for r in replicas)
    status = "ok" if up == len(replicas) else "degraded" if up else "unavailable"
    return (200 if up else 503), {"status": status, "replicas": replicas}
