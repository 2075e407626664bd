"""Ties at the reference's DSA indexer top-k boundary (issue 41, item 3).

A DSA indexer keeps the k keys (or k-pools) of highest score per query. With few indexer heads
(4 in a tiny DeepSeek-V3.2, 8 in GLM-5.3-Flash) the ReLU of each head's dot products often
leaves several boundary scores exactly equal (all zero, or one head's value); which of them
is kept is then arbitrary: hyla keeps the lower index, `torch.topk` whichever its sort meets.
From the first query row whose selection differs, the two models attend to different tokens
and their logits part (by 0.3-0.7 in the tiny models), and every later position inherits it.

`IndexerTieProbe` watches the `topk` calls made inside the reference model's indexer modules
(classes named `*Indexer`) during one forward and records the query rows whose k-th and
(k+1)-th scores tie: equal within `TIE_RTOL` of the row's largest score (near-ties flip with
rounding order too). The precision check then compares positions before the first tied row
strictly, and reports failures at or after it as tie-induced rather than as a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

TIE_RTOL = 1e-5
TOPK_FUNCS = (torch.topk, torch.Tensor.topk)


@dataclass
class Tie:
    """The first tied query row of one forward: its position, indexer module and how many
    rows tied in all."""

    position: int
    module: str
    num_rows: int


def tied_rows(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Query rows of `scores` `[..., S, T]` whose top-`k` boundary ties: `[S]` bool.

    Masked candidates (-inf, or the dtype's lowest value as GLM's indexer writes) never tie."""
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
    """Hooks on every `*Indexer` module of `model`; `reset()` before a forward, `first()`
    after it."""

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
        """The first tied row of the forward since `reset()` (None: no tie)."""
        found = [(int(r.nonzero()[0]), name, int(r.sum())) for name, r in self.rows.items()
                 if bool(r.any())]  # fmt: skip
        if not found:
            return None
        position, name, _ = min(found)
        return Tie(position, name, sum(n for _, _, n in found))
