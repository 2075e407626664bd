"""The grouped-GEMM MoE kernels on CPU tensors under TRITON_INTERPRET=1 (tiny shapes): the checks
of `test_moe_grouped_gpu.py` without a GPU, against the per-expert reference. Skipped as
`test_moe_interpret.py` is (no triton, CUDA present, or triton imported earlier without the
flag: run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_moe_grouped_gpu import check_align, check_grouped

pytestmark = interpreter.marks("test_moe_grouped_gpu.py")


@pytest.mark.parametrize("T", [1, 5, 40])
def test_grouped_fp32(T: int) -> None:
    assert check_grouped(T, torch.float32, "cpu", dims=(8, 3, 40, 24)) <= 1e-5


def test_grouped_uneven_tiles_many_blocks() -> None:
    # D = 72 and I = 100: partial K and N tiles; 90 tokens: experts spanning two row blocks
    assert check_grouped(90, torch.float32, "cpu", dims=(6, 2, 72, 100)) <= 1e-5


def test_align_layout() -> None:
    check_align(50, 8, 3, "cpu")
    check_align(3, 16, 2, "cpu", block_m=64)
