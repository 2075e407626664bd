"""The fp8 kernels (`hyla.ops.fp8.kernels`, `moe_kernels`) on CPU tensors under
TRITON_INTERPRET=1 (small shapes): the checks of `test_fp8_gpu.py` without a GPU. Skipped as
the other interpreter files are."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_fp8_gpu import (
    BOUNDS,
    check_linear,
    check_moe,
    check_quantize_rows,
    check_saturation,
)

pytestmark = interpreter.marks("test_fp8_gpu.py")


@pytest.mark.parametrize("m", [1, 4, 5, 33])
@pytest.mark.parametrize("n, k", [(40, 200), (7, 129)])
def test_fp8_linear(m: int, n: int, k: int) -> None:
    assert check_linear(m, n, k, torch.float32, "cpu") <= BOUNDS[torch.float32]


def test_fp8_linear_small_blocks_bf16() -> None:
    assert check_linear(18, 50, 70, torch.bfloat16, "cpu", block=(16, 32)) <= BOUNDS[torch.bfloat16]


@pytest.mark.parametrize("m", [2, 20])
def test_fp8_linear_zero_blocks_and_extreme_scales(m: int) -> None:
    assert check_linear(m, 40, 80, torch.float32, "cpu", block=(16, 32), extreme=True) <= 1e-5


def test_fp8_linear_saturation_is_finite() -> None:
    check_saturation("cpu")


def test_quantize_rows_is_the_reference() -> None:
    check_quantize_rows("cpu")


@pytest.mark.parametrize("grouped", [False, True])
def test_fp8_moe(grouped: bool) -> None:
    assert check_moe(3, torch.float32, "cpu", grouped) <= 2e-5
