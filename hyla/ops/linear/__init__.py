"""Linear projection: `reference.linear` (F.linear, the definition) and `prepacked_linear`
(`cpu.py`: oneDNN with the weight packed once, for inference on the CPU)."""

from hyla.ops.linear.cpu import PrepackedWeight, prepacked_linear
from hyla.ops.linear.reference import linear

__all__ = ["PrepackedWeight", "linear", "prepacked_linear"]
