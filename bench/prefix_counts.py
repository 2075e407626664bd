"""Per-step host-side work of a prefix-cache hit vs a cold prefill, counted on any device.

On a GPU a small model's prefill is bounded by the host: every kernel launch, every host<->device
sync (which drains the queue the host had built ahead), every Python loop over blocks. This
module counts them for one engine step, so the CPU can show what a GPU step would pay:

    torch_ops        every torch function / tensor method called (a proxy for launches);
                     `device_path_ops` those called from outside the CPU-only op bodies
    sync_sites       calls that wait for the device on CUDA: `.tolist()`, `.item()`, `.cpu()`,
                     `nonzero`, `torch.tensor(..., device=...)` (a copy from pageable memory),
                     `.to(device)` of a host tensor that is not pinned (`index_tensor` pins)
    chunk_calls      chunked delta-rule op calls of the layers; split_calls those split at
                     interior boundaries (`split_at_boundaries`) into `rounds`, of which
                     `short_rounds` run the recurrent op; fla_calls: fla chunk-pipeline calls
    prefix_seconds   wall time inside the prefix cache's Python (hash, match, plan, commit)

A host tensor's `.tolist()` is no sync on CUDA either; the counter cannot tell on a CPU run, so
`sync_sites` over-counts alike for a hit and a cold run (compare them, not absolute values);
`device_path_syncs` leaves out the CPU-only op bodies (`CPU_ONLY`), which a GPU never runs.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

SYNC_METHODS = {"tolist", "item", "cpu", "nonzero", "__bool__"}
# op bodies that run on the CPU only (on CUDA fla's kernels and the Triton conv replace them)
CPU_ONLY = {"kda/cpu.py", "gdn/cpu.py", "kda/chunk_algebra.py", "short_conv/cpu.py",
            "kda/reference.py", "gdn/reference.py", "short_conv/reference.py"}  # fmt: skip


@dataclass
class StepCounts:
    torch_ops: int = 0
    device_path_ops: int = 0
    sync_sites: Counter = field(default_factory=Counter)  # "file:line name" -> calls
    chunk_calls: int = 0
    split_calls: int = 0
    rounds: int = 0
    short_rounds: int = 0
    prefix_seconds: float = 0.0

    @property
    def fla_calls(self) -> int:
        """Chunked-op calls that reach the kernels (fla's chunk pipeline on CUDA): unsplit calls
        + rounds, less the short rounds run by the one-kernel recurrent op."""
        return self.chunk_calls - self.split_calls + self.rounds - self.short_rounds

    @property
    def num_syncs(self) -> int:
        return sum(self.sync_sites.values())

    @property
    def num_device_path_syncs(self) -> int:
        """Sync sites outside the CPU-only op bodies (`CPU_ONLY`): those a GPU step runs too."""
        return sum(n for site, n in self.sync_sites.items() if site.split(":")[0] not in CPU_ONLY)

    def summary(self) -> dict:
        return {
            "torch_ops": self.torch_ops,
            "device_path_ops": self.device_path_ops,
            "sync_sites": self.num_syncs,
            "device_path_syncs": self.num_device_path_syncs,
            "chunk_calls": self.chunk_calls,
            "fla_calls": self.fla_calls,
            "split_calls": self.split_calls,
            "rounds": self.rounds,
            "short_rounds": self.short_rounds,
            "prefix_ms": round(1e3 * self.prefix_seconds, 3),
        }


class _OpCounter(TorchFunctionMode):
    def __init__(self, counts: StepCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.counts.torch_ops += 1
        frame = sys._getframe(1)
        path = "/".join(frame.f_code.co_filename.rsplit("/", 2)[-2:])
        self.counts.device_path_ops += path not in CPU_ONLY
        name = getattr(func, "__name__", "")
        if _is_sync(name, args, kwargs) and frame.f_code.co_name != "index_tensor":
            self.counts.sync_sites[f"{path}:{frame.f_lineno} {name}"] += 1
        return func(*args, **kwargs)


def _is_sync(name: str, args: tuple, kwargs: dict) -> bool:
    if name in SYNC_METHODS:
        return True
    if name in ("tensor", "as_tensor"):
        return kwargs.get("device") is not None
    if name == "to" and args and isinstance(args[0], torch.Tensor):
        src = args[0]
        moves = "device" in kwargs or any(
            isinstance(a, (str, torch.device)) for a in args[1:]
        )  # fmt: skip
        return moves and not kwargs.get("non_blocking", False) and not src.is_pinned()
    if name == "__getitem__" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        return args[1].dtype == torch.bool  # a boolean mask: its count is read back
    return False


@contextmanager
def count_step(ops: bool = True):
    """Count the host work of the code run inside (see the module docstring); yields the
    `StepCounts` being filled. `ops=False` counts calls and prefix-cache time only (cheap
    enough to leave on while timing; torch_ops and sync_sites stay 0)."""
    counts = StepCounts()
    with ExitStack() as stack:
        for patch in _patches(counts):
            stack.enter_context(patch)
        if ops:
            stack.enter_context(_OpCounter(counts))
        yield counts


def _patches(counts: StepCounts):
    import hyla.cache.prefix as prefix
    import hyla.layers.linear_attention as layers

    yield _wrap(layers, "chunk_kda", counts, "chunk_calls")
    yield _wrap(layers, "chunk_gated_delta_rule", counts, "chunk_calls")
    for module in _split_users():
        yield _wrap(module, "split_at_boundaries", counts, "split_calls", rounds=True)
    for name in ("match", "plan_saves", "commit", "begin", "record", "release"):
        yield _timed(prefix.PrefixCache, name, counts)


def _split_users():
    import importlib

    for name in ("hyla.ops.kda.cpu", "hyla.ops.gdn.cpu", "hyla.ops.kda.kernels",
                 "hyla.ops.gdn.kernels"):  # fmt: skip
        try:
            module = importlib.import_module(name)
        except ImportError:  # the kernels need triton / fla
            continue
        if hasattr(module, "split_at_boundaries"):
            yield module


@contextmanager
def _wrap(module, name: str, counts: StepCounts, field_name: str, rounds: bool = False):
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        setattr(counts, field_name, getattr(counts, field_name) + 1)
        if rounds:
            from hyla.ops.kda import boundaries

            marks = kwargs["state_boundaries"]
            counts.rounds += max((len(b) + 1 for b in marks), default=1)
            if hasattr(marks, "rounds") and kwargs.get("recurrent_fn") is not None:
                short = [r for r in marks.rounds if r.max_len <= boundaries.SHORT_ROUND_TOKENS]
                counts.short_rounds += len(short)
        return original(*args, **kwargs)

    setattr(module, name, wrapped)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextmanager
def _timed(cls, name: str, counts: StepCounts):
    original = getattr(cls, name)

    def wrapped(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            counts.prefix_seconds += time.perf_counter() - start

    setattr(cls, name, wrapped)
    try:
        yield
    finally:
        setattr(cls, name, original)
