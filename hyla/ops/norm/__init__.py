"""RMSNorm variants. See `reference.py`."""

from hyla.ops.norm.reference import gated_rms_norm, rms_norm

__all__ = ["gated_rms_norm", "rms_norm"]
