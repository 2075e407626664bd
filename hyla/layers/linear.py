"""`Linear`: nn.Linear whose fp32 CPU inference runs `hyla.ops.linear.prepacked_linear`;
`stacked_linear`: several bias-free projections of one input as one matmul."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hyla.ops.linear import Prepacked, prepacked_linear, prepacked_stacked_linear


class Linear(nn.Linear):
    """`nn.Linear` with the same parameters, names and init; without autograd, fp32 on the CPU,
    its forward multiplies by a oneDNN copy of the weight packed once (`self.packed`, rebuilt
    when the weight changes), about twice as fast as torch's default for a decode step's rows.
    Other dtypes, devices and training use `F.linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs) -> None:
        super().__init__(in_features, out_features, bias, **kwargs)
        self.packed = Prepacked()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] -> [..., out_features]."""
        return prepacked_linear(x, self.weight, self.packed, self.bias)


def stacked_linear(x: torch.Tensor, linears: Sequence[nn.Linear], cache: Prepacked) -> torch.Tensor:
    """`torch.cat([m(x) for m in linears], -1)` for bias-free modules, as one matmul over their
    stacked weights (`cache` keeps the packed stack; see `prepacked_stacked_linear`).

    Raises: ValueError when a module has a bias."""
    if any(m.bias is not None for m in linears):
        raise ValueError("stacked_linear: modules with a bias are not supported")
    return prepacked_stacked_linear(x, [m.weight for m in linears], cache)
