"""What the layers read about a step's sequence lengths, built once per step and device by whoever
builds the step: the model runner for an eager step (`AttentionMetadata.eager`), a captured
decode step for its static buffers (`AttentionMetadata.static`). Layers read its fields; none
asks whether it runs eagerly, on which device, or inside a CUDA-graph capture.

                        eager, CPU      eager, CUDA      static (graph capture and replay)
    seq_lens            [N] device      [N] device       [Bp] capture buffer, refilled per step
    max_seq_len         true maximum    true maximum     context bucket Lb (a bound)
    seq_lens_host       host list       host list        None: the step's lengths are not on
                                                         the host when the graph replays
    lengths_on_device   False           True (triton)    True
    graph_kernels       False           False            True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from hyla.ops.gpu import triton_available


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step lengths for the attention and linear layers.

    Attributes:
        seq_lens: [N] int32 (int64 in static steps) context + new tokens per sequence, on the
            step's device.
        max_seq_len: host int >= every sequence's length; sizes buffers and split counts.
        seq_lens_host: the same lengths as a host list, or None when only the device holds
            them (a static step): host-planned paths (per-sequence loops, slot ranges, the
            varlen conv's host flags) are then unavailable.
        lengths_on_device: layers take lengths from `seq_lens` and sizes from `max_seq_len`
            only (one launch over all rows; no host value of the step shapes the work).
        graph_kernels: ops pick the forms that are fastest when replayed from a CUDA graph
            (the DSA indexer's radix top-k select).
        has_state: [N] int64 1 where a sequence continues its slot's state, 0 where it starts
            from zeros, in a static multi-token step (`hyla.engine.mixed_graphs`): the linear
            layers then run one fixed-grid call over all sequences; None otherwise.
    """

    seq_lens: torch.Tensor
    max_seq_len: int
    seq_lens_host: list[int] | None
    lengths_on_device: bool
    graph_kernels: bool = False
    has_state: torch.Tensor | None = None

    @classmethod
    def eager(cls, seq_lens_host: list[int], seq_lens: torch.Tensor) -> AttentionMetadata:
        """An eager step's metadata: its lengths as host ints and as `seq_lens` [N] on the
        step's device (copied from them)."""
        return cls(
            seq_lens=seq_lens,
            max_seq_len=max(seq_lens_host, default=0),
            seq_lens_host=seq_lens_host,
            lengths_on_device=seq_lens.is_cuda and triton_available(),
        )

    @classmethod
    def static(cls, seq_lens: torch.Tensor, max_seq_len: int) -> AttentionMetadata:
        """A static step's metadata over its capture buffer `seq_lens` (filled before each
        replay) and its context bucket `max_seq_len`."""
        return cls(seq_lens, max_seq_len, None, lengths_on_device=True, graph_kernels=True)

    def with_state_mask(self, has_state: torch.Tensor) -> AttentionMetadata:
        """This static step's metadata for a multi-token step with the state mask `has_state`."""
        return dataclasses.replace(self, has_state=has_state)
