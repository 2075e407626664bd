"""Linear projection: `reference.linear` (F.linear, the definition) and the oneDNN path of
`cpu.py` (weights packed once, for fp32 inference on the CPU): `prepacked_linear`,
`prepacked_stacked_linear`, and `Prepacked` / `packed_matmul` / `usable` for callers that hold
many packed matrices (the MoE experts)."""

from hyla.ops.linear.cpu import (
    Prepacked,
    packed_matmul,
    prepacked_linear,
    prepacked_stacked_linear,
    usable,
)
from hyla.ops.linear.reference import linear

__all__ = [
    "Prepacked",
    "linear",
    "packed_matmul",
    "prepacked_linear",
    "prepacked_stacked_linear",
    "usable",
]
