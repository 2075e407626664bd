"""The Triton GEMV of `hyla.ops.linear.gemv` on CPU tensors under TRITON_INTERPRET=1 (tiny
shapes): the checks of `test_linear_gpu.py` without a GPU. Skipped as the other interpreter
files are (no triton, CUDA present, or triton imported earlier without the flag)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_linear_gpu import BOUNDS, check_gemv

pytestmark = interpreter.marks("test_linear_gpu.py")


@pytest.mark.parametrize("rows", [1, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv(rows: int, dtype: torch.dtype) -> None:
    assert check_gemv(rows, 40, 72, dtype, "cpu") <= BOUNDS[dtype]


def test_gemv_uneven_tiles() -> None:
    from hyla.ops.linear.gemv import GemvTiles

    assert check_gemv(2, 9, 70, torch.float32, "cpu", GemvTiles(4, 32, 4)) <= 1e-5


def test_gemv_mixed_dtypes() -> None:
    assert check_gemv(1, 12, 70, torch.bfloat16, "cpu", w_dtype=torch.float32) <= 1e-5
