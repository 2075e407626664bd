"""Per-step sequence lengths the layers read: `eager` steps, or `static` captured decode steps."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from hyla.ops.gpu import triton_available


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step lengths for the attention and linear layers.

    seq_lens: [N] int32 (int64 static) on the step's device; max_seq_len: a host bound on them;
    seq_lens_host: None when static. lengths_on_device: size work from those two only (one launch);
    graph_kernels: pick replay-fast ops; has_state: [N] int64 (static multi-token steps) or None."""

    seq_lens: torch.Tensor
    max_seq_len: int
    seq_lens_host: list[int] | None
    lengths_on_device: bool
    graph_kernels: bool = False
    has_state: torch.Tensor | None = None

    @classmethod
    def eager(cls, seq_lens_host: list[int], seq_lens: torch.Tensor) -> AttentionMetadata:
        return cls(
            seq_lens=seq_lens,
            max_seq_len=max(seq_lens_host, default=0),
            seq_lens_host=seq_lens_host,
            lengths_on_device=seq_lens.is_cuda and triton_available(),
        )

    @classmethod
    def static(cls, seq_lens: torch.Tensor, max_seq_len: int) -> AttentionMetadata:
        return cls(seq_lens, max_seq_len, None, lengths_on_device=True, graph_kernels=True)

    def with_state_mask(self, has_state: torch.Tensor) -> AttentionMetadata:
        return dataclasses.replace(self, has_state=has_state)
