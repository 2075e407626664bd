"""Data-parallel replicas on Ray behind one front end with a prefix-aware router."""

from __future__ import annotations

from typing import Any


def serve_replicas(model: str | None, options: dict[str, Any], num_replicas: int,
                   ray_address: str | None = None) -> Any:  # fmt: skip
    """A `ReplicaClient` over new replicas that it ends on shutdown (`--data-parallel-size N`)."""
    from hyla.replicas.client import ReplicaClient
    from hyla.replicas.launch import start_replicas

    replicas = start_replicas(model, options, num_replicas, ray_address)
    try:
        return ReplicaClient(replicas, close_replicas=True)
    except BaseException:
        replicas.close()
        raise
