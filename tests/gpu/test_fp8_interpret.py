"""The fp8 kernels (`hyla.ops.fp8.kernels`, `moe_kernels`) on CPU tensors under
TRITON_INTERPRET=1 (small shapes): the checks of `test_fp8_gpu.py` without a GPU. Skipped as
the other interpreter files are."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_fp8_gpu import (
    ALIGN_CASES,
    BOUNDS,
    MOE_BF16_BOUND,
    check_align,
    check_linear,
    check_moe,
    check_moe_shared,
    check_quantize_rows,
    check_saturation,
)

pytestmark = interpreter.marks("test_fp8_gpu.py")


@pytest.mark.parametrize("m", [1, 4, 5, 33, 70])
@pytest.mark.parametrize("n, k", [(40, 200), (7, 129)])
def test_fp8_linear(m: int, n: int, k: int) -> None:
    assert check_linear(m, n, k, torch.float32, "cpu") <= BOUNDS[torch.float32]


@pytest.mark.parametrize("block", [(6, 32), (1, 64)])
def test_fp8_gemv_blocks_not_a_multiple_of_its_columns(block) -> None:
    # bn = 6 or 1: programs narrow to 2 or 1 columns so that their rows share a scale row
    assert check_linear(2, 41, 200, torch.float32, "cpu", block=block) <= 1e-5


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
@pytest.mark.parametrize("num_tokens, topk", [(3, 2), (2, 3), (1, 4)])
def test_fp8_moe(grouped: bool, num_tokens: int, topk: int) -> None:
    assert check_moe(num_tokens, torch.float32, "cpu", grouped, topk=topk) <= 2e-5


def test_fp8_moe_grouped_several_blocks_per_expert_bf16() -> None:
    # 40 pairs over 6 experts: some expert runs span two 16-row blocks
    assert check_moe(20, torch.bfloat16, "cpu", True) <= MOE_BF16_BOUND


@pytest.mark.parametrize("num_tokens, topk, experts, block_m", ALIGN_CASES)
def test_align_kernel_is_the_pytorch_align(num_tokens, topk, experts, block_m) -> None:
    check_align(num_tokens, topk, experts, block_m, "cpu")


@pytest.mark.parametrize("num_tokens", [1, 3])
def test_fp8_moe_with_shared_expert(num_tokens: int) -> None:
    assert check_moe_shared(num_tokens, torch.float32, "cpu") <= 2e-5
