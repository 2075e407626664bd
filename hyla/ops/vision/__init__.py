"""Vision-encoder ops; PyTorch only (an image is encoded once, off the decode hot path)."""

from __future__ import annotations

from hyla.ops.vision.reference import (
    apply_rotate_half,
    axial_cos_sin,
    patch_positions,
    segment_attention,
)

__all__ = ["apply_rotate_half", "axial_cos_sin", "patch_positions", "segment_attention"]
