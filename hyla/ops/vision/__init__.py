"""Vision-encoder ops (axial rope, per-image bidirectional attention). See `reference.py`;
PyTorch on every device (an image is encoded once per request, off the decode hot path)."""

from __future__ import annotations

from hyla.ops.vision.reference import (
    apply_rotate_half,
    axial_cos_sin,
    patch_positions,
    segment_attention,
)

__all__ = ["apply_rotate_half", "axial_cos_sin", "patch_positions", "segment_attention"]
