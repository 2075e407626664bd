"""The hyper-connection kernels on CPU tensors under TRITON_INTERPRET=1: the checks of
`test_hyper_connection_gpu.py` without a GPU. Skipped as `test_dsa_interpret.py` is (no triton,
CUDA present, or triton imported earlier without the flag: run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_hyper_connection_gpu import SHAPES, check_expand, check_pre_norm

pytestmark = interpreter.marks("test_hyper_connection_gpu.py")
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize(("T", "N", "D"), SHAPES[:3])
def test_pre_norm(T: int, N: int, D: int, dtype: torch.dtype) -> None:
    check_pre_norm(T, N, D, dtype, "cpu")


def test_pre_norm_with_offset() -> None:
    check_pre_norm(3, 4, 64, torch.float32, "cpu", offset=1.0)


@DTYPES
@pytest.mark.parametrize(("T", "N", "D"), SHAPES[:3])
def test_expand(T: int, N: int, D: int, dtype: torch.dtype) -> None:
    check_expand(T, N, D, dtype, "cpu")
