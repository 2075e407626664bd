"""One rank's process groups: device collectives (NCCL, or gloo on the CPU) and a gloo group
for host objects. Expert parallelism runs inside the TP group (EP size = TP size)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

IDLE_TIMEOUT = timedelta(days=30)
START_TIMEOUT = timedelta(minutes=5)  # to start and join (imports, no weights)


class ExecutorError(RuntimeError):
    """A rank died, hung or failed a step: the engine cannot go on (the caches may disagree)."""


@dataclass(frozen=True)
class TPGroup:
    """The TP group as one rank sees it; world size 1 has no groups (collectives are identities)."""

    rank: int
    world_size: int
    group: Any = None
    cpu_group: Any = None
    ready_group: Any = None

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., world_size * n], rank order."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def broadcast_(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.broadcast(x, src=0, group=self.group)
        return x

    def broadcast_object(self, obj: Any = None) -> Any:
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any] | None:
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.cpu_group)
        return out

    def wait_until_ready(self) -> None:
        """Barrier without the step timeout: loading weights can take minutes."""
        if self.world_size > 1:
            dist.barrier(group=self.ready_group)

    def min_ints(self, values: list[int]) -> list[int]:
        if self.world_size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return t.tolist()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_tp_group(
    rank: int, world_size: int, init_method: str, device: str, timeout_s: float
) -> TPGroup:
    """Join as `rank` (blocks until all joined); collectives raise after `timeout_s` idle."""
    if world_size == 1:
        return TPGroup(0, 1)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=START_TIMEOUT
    )
    ranks = list(range(world_size))
    # ranks 1..N-1 wait for the next plan as long as the engine idles; rank 0 detects hangs
    cpu_timeout = timeout if rank == 0 else IDLE_TIMEOUT
    cpu_group = dist.new_group(ranks, backend="gloo", timeout=cpu_timeout)
    ready_group = dist.new_group(ranks, backend="gloo", timeout=IDLE_TIMEOUT)
    group = dist.new_group(ranks, backend=backend, timeout=timeout)
    return TPGroup(rank, world_size, group, cpu_group, ready_group)


def destroy_tp_group(tp: TPGroup) -> None:
    if tp.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
