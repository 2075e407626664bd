"""Clamped-SwiGLU routed experts (GLM-5.3-Flash). See `reference.py`; PyTorch on every device
(no fused GPU kernel yet: the GEMVs of `hyla.ops.moe` compute an unclamped SwiGLU)."""

from __future__ import annotations

from hyla.ops.moe_clamped.reference import moe_experts_clamped

__all__ = ["moe_experts_clamped"]
