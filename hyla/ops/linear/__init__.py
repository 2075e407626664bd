"""Linear projections: F.linear or a Triton GEMV, prepacked oneDNN, stacked weights."""

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
