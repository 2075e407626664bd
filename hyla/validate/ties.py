"""Ties at the reference's DSA indexer top-k boundary (issue 41): hyla (lower index) and
`torch.topk` keep different keys; `IndexerTieProbe` finds such rows to mark later failures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

TIE_RTOL = 1e-5
TOPK_FUNCS = (torch.topk, torch.Tensor.topk)


@dataclass
class Tie:
    """The first tied query row of one forward: position, indexer module, total tied rows."""

    position: int
    module: str
    num_rows: int


def tied_rows(scores: torch.Tensor, k: int) -> torch.Tensor:
    """`[S]` bool: rows of `scores` `[..., S, T]` whose top-`k` boundary ties (masked never do)."""
    scores = scores.detach().float()
    if scores.shape[-1] <= k or k < 1:
        return torch.zeros(scores.shape[-2], dtype=torch.bool)
    top = scores.topk(k + 1, dim=-1).values  # [..., S, k + 1], descending
    kth, after = top[..., k - 1], top[..., k]
    lowest = torch.finfo(torch.float32).min / 2
    scale = top[..., 0].abs().clamp_min(torch.finfo(torch.float32).tiny)
    tied = (after > lowest) & torch.isfinite(after) & (kth - after <= TIE_RTOL * scale)
    return tied.reshape(-1, tied.shape[-1]).any(0).cpu()


class _TopkRecorder(TorchFunctionMode):
    def __init__(self, probe: IndexerTieProbe, name: str) -> None:
        super().__init__()
        self.probe, self.name = probe, name

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        if func in TOPK_FUNCS:
            self.probe.record(self.name, *args, **kwargs)
        return func(*args, **kwargs)


@dataclass
class IndexerTieProbe:
    """Hooks on every `*Indexer` of `model`; `reset()` before a forward, `first()` after it."""

    model: Any
    rows: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.modules = [(n, m) for n, m in self.model.named_modules()
                        if type(m).__name__.endswith("Indexer")]  # fmt: skip
        for name, module in self.modules:
            module.register_forward_pre_hook(self._enter(name))
            module.register_forward_hook(self._exit)
        self._modes: list[_TopkRecorder] = []

    @property
    def has_indexer(self) -> bool:
        return bool(self.modules)

    def _enter(self, name: str) -> Any:
        def hook(module: Any, args: Any) -> None:
            mode = _TopkRecorder(self, name)
            mode.__enter__()
            self._modes.append(mode)

        return hook

    def _exit(self, module: Any, args: Any, output: Any) -> None:
        self._modes.pop().__exit__(None, None, None)

    def record(self, name: str, scores: torch.Tensor, k: int, dim: int = -1, *_: Any,
               **__: Any) -> None:  # fmt: skip
        if dim not in (-1, scores.dim() - 1) or not scores.is_floating_point():
            return
        rows = tied_rows(scores, int(k))
        self.rows[name] = rows if name not in self.rows else self.rows[name] | rows

    def reset(self) -> None:
        self.rows = {}

    def first(self) -> Tie | None:
        found = [(int(r.nonzero()[0]), name, int(r.sum())) for name, r in self.rows.items()
                 if bool(r.any())]  # fmt: skip
        if not found:
            return None
        position, name, _ = min(found)
        return Tie(position, name, sum(n for _, _, n in found))
