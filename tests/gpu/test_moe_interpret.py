"""The Triton MoE GEMV kernels on CPU tensors under TRITON_INTERPRET=1 (tiny shapes): the checks of
`test_moe_gpu.py` without a GPU. Skipped as `test_dsa_interpret.py` is (no triton, CUDA present,
or triton imported earlier without the flag: run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_moe_gpu import check_combine, check_gemv

pytestmark = interpreter.marks("test_moe_gpu.py")


@pytest.mark.parametrize("T", [1, 3])
def test_gemv(T: int) -> None:
    assert check_gemv(T, torch.float32, "cpu", dims=(8, 3, 40, 24)) <= 1e-5
    assert check_gemv(T, torch.bfloat16, "cpu", dims=(8, 2, 40, 24)) <= 3e-2


def test_gemv_uneven_tiles() -> None:
    from hyla.ops.moe.gemv import GemvBlocks

    b = GemvBlocks(2, 16, 4, 4, 16, 4)  # splits I = 24 and D = 40 unevenly
    assert check_gemv(2, torch.float32, "cpu", dims=(8, 3, 40, 24), blocks=b) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_combine(dtype: torch.dtype) -> None:
    # fp32: bitwise; bf16: the interpreter truncates each rounding (GPU: bitwise, see there)
    bound = 0.0 if dtype == torch.float32 else 2.0**-6
    assert check_combine(3, 8, 3, 40, dtype, "cpu") <= bound
    assert check_combine(2, 16, 4, 600, dtype, "cpu") <= bound  # two column blocks
