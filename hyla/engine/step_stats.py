"""Per-step counters by execution path (steps, launch and device seconds), for /metrics; CUDA
events are read once done, with no host sync."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

PATHS = ("decode_graph", "mixed_graph", "eager")


@dataclass
class StepStats:
    steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    launch_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PATHS, 0.0))
    device_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PATHS, 0.0))
    _open: deque = field(default_factory=deque, repr=False)

    def start(self, device: torch.device) -> torch.cuda.Event | None:
        if device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, path: str, launch_s: float, begin: torch.cuda.Event | None) -> None:
        self.steps[path] += 1
        self.launch_seconds[path] += launch_s
        if begin is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._open.append((path, begin, end))
        self._collect()

    def _collect(self) -> None:
        while self._open and self._open[0][2].query():
            path, begin, end = self._open.popleft()
            self.device_seconds[path] += begin.elapsed_time(end) / 1e3

    def snapshot(self) -> dict[str, dict[str, float]]:
        self._collect()
        return {
            "steps": dict(self.steps),
            "launch_seconds": dict(self.launch_seconds),
            "device_seconds": dict(self.device_seconds),
        }
