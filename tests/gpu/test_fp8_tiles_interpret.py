"""Every tile variant of the fp8 kernels (`hyla.ops.fp8.tiles`: more columns per program, a
pipelined K loop, multi-row GEMV programs, split-K with its fixed-order sum, small-M GEMM
tiles, x quantized before the GEMM; MoE tiles of both forms) against `hyla.ops.fp8.reference`
on CPU tensors under TRITON_INTERPRET=1: the variants `bench/gpu_fp8_sweep.py` may put in a
tuned table compute the same quantization, with K and N not multiples of the block, zero
blocks and extreme scales."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_fp8_gpu import BOUNDS, check_linear, check_moe, linear_variants, moe_variants

pytestmark = interpreter.marks("test_fp8_gpu.py")

LINEAR = linear_variants(small=True)
MOE = moe_variants()


def _rows(variant: str) -> tuple[int, ...]:
    # the interpreter runs programs one by one: one-row GEMV variants at few rows
    if variant == "default":
        return (1, 3, 20)
    return (1, 3) if variant.startswith("gemv") and "rows" not in variant else (3, 20)


@pytest.mark.parametrize(
    "variant, m", [(v, m) for v in LINEAR for m in _rows(v)], ids=lambda v: str(v)
)
def test_fp8_linear_tile_variants(variant: str, m: int) -> None:
    # block (16, 32): K = 200 in 7 groups (the last partial), loads of 32 / 64 columns in a
    # loop, N = 41 a partial last program / tile
    assert check_linear(m, 41, 200, torch.float32, "cpu", (16, 32), config=LINEAR[variant]) <= 1e-5


@pytest.mark.parametrize("variant", list(LINEAR))
def test_fp8_linear_tile_variants_zero_blocks_and_extreme_scales(variant: str) -> None:
    config = LINEAR[variant]
    assert check_linear(2, 40, 80, torch.float32, "cpu", (16, 32), True, config) <= 1e-5


@pytest.mark.parametrize("variant", ["gemv-rows16-split3", "gemm-16x64-split3"])
def test_fp8_linear_tile_variants_bk128_bf16(variant: str) -> None:
    # bk = 128 with K = 300 and N = 136 (neither a multiple of 128), bf16 in and out
    got = check_linear(6, 136, 300, torch.bfloat16, "cpu", config=LINEAR[variant])
    assert got <= BOUNDS[torch.bfloat16]


@pytest.mark.parametrize("variant", list(MOE))
@pytest.mark.parametrize("grouped", [False, True])
def test_fp8_moe_tile_variants(variant: str, grouped: bool) -> None:
    assert check_moe(3, torch.float32, "cpu", grouped, tiles=MOE[variant]) <= 2e-5
