"""Which replica serves a request: prefix-aware, least-loaded, with a load cap. Plain Python.
Predicted hits count requests routed but not finished, so a burst sharing a prefix lands together
and waits for the first one's prefill. A small load gap (`balance_abs_tokens`) is no imbalance;
a deeper hit is worth a larger one (the cap's least load adds the prefill the hit saves)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

RoutingPolicy = Literal["prefix", "least_loaded", "round_robin"]
ROUTING_POLICIES = ("prefix", "least_loaded", "round_robin")


class NoReplicaError(RuntimeError): ...


@dataclass(frozen=True)
class RouterConfig:
    """`policy`: "prefix" (least-loaded when over the load cap), "least_loaded" or "round_robin"."""

    policy: RoutingPolicy = "prefix"
    balance_abs_tokens: int = 8192
    balance_rel: float = 2.0

    def __post_init__(self) -> None:
        if self.policy not in ROUTING_POLICIES:
            raise ValueError(f"policy: {self.policy!r} not in {ROUTING_POLICIES}")
        if self.balance_abs_tokens < 0:
            raise ValueError(f"balance_abs_tokens: must be >= 0, got {self.balance_abs_tokens}")
        if self.balance_rel < 1.0:
            raise ValueError(f"balance_rel: must be >= 1, got {self.balance_rel}")


@dataclass(frozen=True)
class Route:
    """`reason`: prefix, least_loaded, capped or round_robin."""

    replica: int
    reason: str
    predicted_hit_tokens: int = 0


@dataclass(frozen=True)
class CacheDelta:
    """A replica's prefix-cache keys' change since `base_version` (None: a full snapshot)."""

    version: int
    base_version: int | None
    added_blocks: frozenset[int] = frozenset()
    removed_blocks: frozenset[int] = frozenset()
    added_checkpoints: frozenset[int] = frozenset()
    removed_checkpoints: frozenset[int] = frozenset()


@dataclass
class _Pending:
    replica: int
    num_tokens: int
    block_keys: list[int]
    checkpoint_keys: list[int]
    admit_seq: int | None = None


@dataclass
class ReplicaView:
    is_alive: bool = True
    reported_tokens: int = 0
    report_seq: int = 0  # admissions the last report counted
    cache_version: int = 0
    blocks: set[int] = field(default_factory=set)
    checkpoints: set[int] = field(default_factory=set)
    routed_blocks: Counter = field(default_factory=Counter)
    routed_checkpoints: Counter = field(default_factory=Counter)
    num_open: int = 0

    def forget_cache(self) -> None:
        self.blocks, self.checkpoints, self.cache_version = set(), set(), 0


class Router:
    """Routes over replicas whose caches checkpoint every `checkpoint_stride` tokens (0: none)."""

    def __init__(
        self, num_replicas: int, block_size: int, checkpoint_stride: int, config: RouterConfig
    ) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas: must be >= 1, got {num_replicas}")
        self.config = config
        self.block_size = block_size
        self.stride = checkpoint_stride
        self.views = [ReplicaView() for _ in range(num_replicas)]
        self.decisions: Counter = Counter()
        self.predicted_hit_tokens = [0] * num_replicas
        self._pending: dict[str, _Pending] = {}
        self._turn = itertools.count()

    def route(self, request_id: str, block_hashes: list[int], num_tokens: int) -> Route:
        """Choose a replica; the request counts there until `finish`. Raises: NoReplicaError."""
        alive = [i for i, v in enumerate(self.views) if v.is_alive]
        if not alive:
            raise NoReplicaError("no replica is serving (all are down or restarting)")
        route = self._choose(alive, block_hashes, num_tokens)
        self._record(request_id, route, block_hashes, num_tokens)
        return route

    def _choose(self, alive: list[int], hashes: list[int], num_tokens: int) -> Route:
        policy = self.config.policy
        if policy == "round_robin":
            return Route(alive[next(self._turn) % len(alive)], "round_robin")
        loads = {i: self.load(i) for i in alive}
        least = min(alive, key=lambda i: (loads[i], self.views[i].num_open, i))
        if policy == "least_loaded":
            return Route(least, "least_loaded")
        hits = {i: self.predicted_hit(i, hashes, num_tokens) for i in alive}
        best = max(alive, key=lambda i: (hits[i], -loads[i], -i))
        if hits[best] == 0:
            return Route(least, "least_loaded")
        if self._over_cap(loads[best], loads[least] + hits[best] - hits[least]):
            return Route(least, "capped", hits[least])
        return Route(best, "prefix", hits[best])

    def _over_cap(self, load: int, min_load: int) -> bool:
        c = self.config
        return load - min_load > c.balance_abs_tokens and load > c.balance_rel * min_load

    def predicted_hit(self, replica: int, hashes: list[int], num_tokens: int) -> int:
        """Tokens `replica`'s prefix cache would serve, its open routed requests included: the
        deepest boundary with the blocks cached and a checkpoint there, >= 1 token left."""
        v = self.views[replica]
        limit = min(len(hashes), max(0, num_tokens - 1) // self.block_size)
        m = 0
        while m < limit and (hashes[m] in v.blocks or hashes[m] in v.routed_blocks):
            m += 1
        if not self.stride:
            return m * self.block_size
        for j in range(m, 0, -1):
            key = hashes[j - 1]
            if key in v.checkpoints or key in v.routed_checkpoints:
                return j * self.block_size
        return 0

    def _record(self, request_id: str, route: Route, hashes: list[int], num_tokens: int) -> None:
        v = self.views[route.replica]
        blocks = list(hashes)
        ends = self._checkpoint_ends(len(hashes), num_tokens)
        checkpoints = [hashes[j - 1] for j in ends]
        v.routed_blocks.update(blocks)
        v.routed_checkpoints.update(checkpoints)
        v.num_open += 1
        self._pending[request_id] = _Pending(route.replica, num_tokens, blocks, checkpoints)
        self.decisions[(route.replica, route.reason)] += 1
        self.predicted_hit_tokens[route.replica] += route.predicted_hit_tokens

    def _checkpoint_ends(self, num_blocks: int, num_tokens: int) -> list[int]:
        """Stride multiples and the last full block before the last token."""
        if not self.stride:
            return []
        step = self.stride // self.block_size
        last = max(0, num_tokens - 1) // self.block_size
        ends = set(range(step, min(num_blocks, last) + 1, step))
        if 0 < last <= num_blocks:
            ends.add(last)
        return sorted(ends)

    def admitted(self, request_id: str, admit_seq: int) -> None:
        pending = self._pending.get(request_id)
        if pending is not None:
            pending.admit_seq = admit_seq

    def finish(self, request_id: str) -> None:
        p = self._pending.pop(request_id, None)
        if p is None:
            return
        v = self.views[p.replica]
        v.routed_blocks.subtract(p.block_keys)
        v.routed_checkpoints.subtract(p.checkpoint_keys)
        v.routed_blocks = +v.routed_blocks  # drop the zero counts
        v.routed_checkpoints = +v.routed_checkpoints
        v.num_open -= 1

    def report(self, replica: int, load_tokens: int, admit_seq: int,
               delta: CacheDelta | None = None) -> None:  # fmt: skip
        """`load_tokens` counts the replica's first `admit_seq` admissions."""
        v = self.views[replica]
        v.reported_tokens, v.report_seq = load_tokens, admit_seq
        if delta is None:
            return
        if delta.base_version is None:
            v.blocks, v.checkpoints = set(delta.added_blocks), set(delta.added_checkpoints)
        elif delta.base_version == v.cache_version:
            v.blocks.difference_update(delta.removed_blocks)
            v.blocks.update(delta.added_blocks)
            v.checkpoints.difference_update(delta.removed_checkpoints)
            v.checkpoints.update(delta.added_checkpoints)
        else:  # a delta on a version we do not hold: wait for the next full snapshot
            v.forget_cache()
            return
        v.cache_version = delta.version

    def load(self, replica: int) -> int:
        """Reported tokens, plus the prompt tokens routed there that the report missed."""
        v = self.views[replica]
        unreported = sum(
            p.num_tokens
            for p in self._pending.values()
            if p.replica == replica and (p.admit_seq is None or p.admit_seq > v.report_seq)
        )
        return v.reported_tokens + unreported

    def set_alive(self, replica: int, is_alive: bool) -> None:
        """A replica went down or came back: either way its cache is empty."""
        v = self.views[replica]
        v.is_alive = is_alive
        v.forget_cache()
        v.reported_tokens = v.report_seq = 0
        for request_id in [r for r, p in self._pending.items() if p.replica == replica]:
            self.finish(request_id)
