"""Linear projection: `linear` (`dispatch.py`: F.linear = `reference.linear`, the definition,
or the Triton GEMV of `gemv.py` for one-row CUDA inputs) and the oneDNN path of
`cpu.py` (weights packed once, for fp32 inference on the CPU): `prepacked_linear`,
`prepacked_stacked_linear`, and `Prepacked` / `packed_matmul` / `usable` for callers that hold
many packed matrices (the MoE experts); `stacked.py`: several projections' weights as row blocks
of one tensor (`stack_rows`), run as one matmul elsewhere."""

from hyla.ops.linear.cpu import (
    Prepacked,
    packed_matmul,
    prepacked_linear,
    prepacked_stacked_linear,
    usable,
)
from hyla.ops.linear.dispatch import linear
from hyla.ops.linear.stacked import adjacent_rows, stack_rows

__all__ = [
    "Prepacked",
    "adjacent_rows",
    "linear",
    "packed_matmul",
    "prepacked_linear",
    "prepacked_stacked_linear",
    "stack_rows",
    "usable",
]
