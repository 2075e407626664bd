"""Count what a call would launch on a GPU, on the CPU: the Triton kernels it starts (under
TRITON_INTERPRET=1) and the PyTorch ops that run a kernel of their own (every aten op except
views, metadata and allocations). A good proxy for a decode step's launches, which bound its
time at small batch (a kernel boundary costs ~1.3 us even inside a CUDA graph)."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that launch nothing on a GPU (views, shape metadata, allocations)
NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view",
    "_unsafe_view", "reshape", "as_strided", "slice", "select", "split", "split_with_sizes",
    "chunk", "unsqueeze", "squeeze", "expand", "permute", "t", "transpose", "detach", "alias",
    "unbind", "narrow", "view_as", "flatten", "unflatten", "lift_fresh", "_to_copy_noop",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "split_copy",
    "promote_types", "result_type",
}  # fmt: skip


@dataclass
class Launches:
    """What one counted region launched: Triton kernels and kernel-running aten ops by name."""

    triton: Counter = field(default_factory=Counter)
    torch: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.triton.values()) + sum(self.torch.values())


class _AtenCounter(TorchDispatchMode):
    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def count_launches():
    """Within the block, count Triton launches (interpreter) and kernel-running aten ops."""
    from triton.runtime.interpreter import InterpretedFunction

    found = Launches()
    run = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        found.triton[self.fn.__name__] += 1
        with torch.utils._python_dispatch._disable_current_modes():
            return run(self, *args, **kwargs)

    InterpretedFunction.run = counted
    try:
        with _AtenCounter(found.torch):
            yield found
    finally:
        InterpretedFunction.run = run
