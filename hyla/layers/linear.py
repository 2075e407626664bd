"""Linear projections: prepacked fp32 on the CPU (`Linear`), block-scaled fp8 (`Fp8Linear`),
and several bias-free projections of one input as one matmul (`stacked_linear`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hyla.ops.fp8 import FP8, fp8_linear
from hyla.ops.linear import Prepacked, prepacked_linear, prepacked_stacked_linear
from hyla.ops.linear.stacked import adjacent_rows, fp8_blocks_line_up


class Linear(nn.Linear):
    """`nn.Linear` whose fp32 CPU inference multiplies by a oneDNN copy of the weight packed
    once (`self.packed`, rebuilt when the weight changes); otherwise `F.linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs) -> None:
        super().__init__(in_features, out_features, bias, **kwargs)
        self.packed = Prepacked()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return prepacked_linear(x, self.weight, self.packed, self.bias)


def resolve_block(block_size: tuple[int, int] | None, in_features: int) -> tuple[int, int]:
    """`block_size`, or one scale per output channel when None."""
    return (1, in_features) if block_size is None else tuple(block_size)


class Fp8Linear(nn.Module):
    """A linear projection with a float8_e4m3fn weight [N, K] and block scales
    `weight_scale_inv` [ceil(N/bn), ceil(K/bk)] (the dequantization multiplier)."""

    keep_fp32 = ("weight_scale_inv",)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        block_size: tuple[int, int] | None = (128, 128),
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.block_size = resolve_block(block_size, in_features)
        bn, bk = self.block_size
        scale_shape = (-(-out_features // bn), -(-in_features // bk))
        empty = lambda *shape, dt: torch.empty(*shape, dtype=dt, device=device)  # noqa: E731
        self.weight = nn.Parameter(empty(out_features, in_features, dt=FP8), requires_grad=False)
        self.weight_scale_inv = nn.Parameter(empty(*scale_shape, dt=torch.float32),
                                             requires_grad=False)  # fmt: skip
        self.bias = None
        if bias:
            self.bias = nn.Parameter(empty(out_features, dt=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale_inv, self.block_size, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, block={self.block_size}"


def stacked_linear(x: torch.Tensor, linears: Sequence[nn.Linear], cache: Prepacked) -> torch.Tensor:
    """`torch.cat([m(x) for m in linears], -1)` as one matmul; `cache` keeps the packed stack.
    Raises ValueError when a module has a bias."""
    if any(m.bias is not None for m in linears):
        raise ValueError("stacked_linear: modules with a bias are not supported")
    if any(isinstance(m, Fp8Linear) for m in linears):
        return _stacked_fp8(x, linears)
    return prepacked_stacked_linear(x, [m.weight for m in linears], cache)


def _stacked_fp8(x: torch.Tensor, linears: Sequence[nn.Module]) -> torch.Tensor:
    if all(isinstance(m, Fp8Linear) for m in linears) and fp8_blocks_line_up(linears):
        weight = adjacent_rows([m.weight for m in linears])
        scale = adjacent_rows([m.weight_scale_inv for m in linears])
        if weight is not None and scale is not None:
            return fp8_linear(x, weight, scale, linears[0].block_size)
    return torch.cat([m(x) for m in linears], dim=-1)
