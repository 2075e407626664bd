"""Hyper-connection mixing (mHC). See `reference.py`; a few small per-token ops, run as
PyTorch on every device (no kernel: off the decode hot path's large reads)."""

from __future__ import annotations

from hyla.ops.hyper_connection.reference import (
    hc_collapse,
    hc_expand,
    hc_head_weights,
    hc_weights,
    sinkhorn,
)

__all__ = ["hc_collapse", "hc_expand", "hc_head_weights", "hc_weights", "sinkhorn"]
