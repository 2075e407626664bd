"""RMSNorm variants. See `reference.py`."""

from hyla.ops.norm.reference import rms_norm

__all__ = ["rms_norm"]
