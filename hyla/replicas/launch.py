"""Start N replica actors on a local Ray or the cluster at `ray_address`; on a local Ray each
CPU replica is pinned to its own share of the cores, and Ray restarts a replica that dies."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

REPLICA_MAX_RESTARTS = 8  # per replica, over the server's life


@dataclass
class ReplicaSet:
    """The actors of N replicas and what replica 0 said of the model (`Replica.describe`)."""

    actors: list[Any]
    info: dict[str, Any]
    owns_ray: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def num_replicas(self) -> int:
        return len(self.actors)

    def close(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.owns_ray:
            ray.shutdown()


def init_ray(num_cpus: int, ray_address: str | None = None) -> bool:
    """Join the cluster at `ray_address`, or start a local Ray; whether a local one was started."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return False
    common = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if ray_address:
        ray.init(address=ray_address, **common)
        return False
    ray.init(num_cpus=num_cpus, object_store_memory=256 << 20, **common)
    return True


def cpu_core_sets(num_replicas: int, per_replica: int | None = None
                  ) -> list[tuple[int, ...]] | None:  # fmt: skip
    """Disjoint cores per replica (`per_replica` each, None: an even share); None when too few."""
    cores = sorted(os.sched_getaffinity(0))
    k = per_replica or len(cores) // num_replicas
    if k * num_replicas > len(cores):
        return None
    if k == 0:
        return None
    return [tuple(cores[i * k : (i + 1) * k]) for i in range(num_replicas)]


def start_replicas(
    model: str | None,
    options: dict[str, Any],
    num_replicas: int,
    ray_address: str | None = None,
    pin_cpus: bool = True,
    cores_per_replica: int | None = None,
) -> ReplicaSet:
    """Start replicas of `LLMEngine.from_path(model, **options)` and wait until all loaded.
    Raises: the first replica's load error."""
    import ray

    from hyla.replicas.replica import Replica

    owns_ray = init_ray(num_cpus=max(num_replicas, 1), ray_address=ray_address)
    on_gpu = _wants_gpu(options)
    is_local = ray_address is None
    cores = (
        cpu_core_sets(num_replicas, cores_per_replica)
        if (is_local and pin_cpus and not on_gpu)
        else None
    )
    gpus = max(1, int(options.get("tensor_parallel_size") or 1)) if on_gpu else 0
    remote = ray.remote(Replica).options(
        num_cpus=1, num_gpus=gpus, max_restarts=REPLICA_MAX_RESTARTS, max_concurrency=1000
    )
    actors = [
        remote.remote(i, model, options, None if cores is None else cores[i])
        for i in range(num_replicas)
    ]
    try:
        ray.get([a.ready.remote() for a in actors])
        info = ray.get(actors[0].describe.remote())
    except BaseException:
        ReplicaSet(actors, {}, owns_ray).close()
        raise
    return ReplicaSet(actors, info, owns_ray, dict(options))


def _wants_gpu(options: dict[str, Any]) -> bool:
    device = options.get("device") or "auto"
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()
