"""The clamped-SwiGLU expert forms on CPU tensors under TRITON_INTERPRET=1: the checks of
`test_moe_clamped_gpu.py` without a GPU. Skipped as `test_moe_interpret.py` is (no triton, CUDA
present, or triton imported earlier without the flag: run this file on its own). The grouped
GEMM runs in fp32 only here: the interpreter's bf16 `tl.dot` is wrong in triton 3.9 (see `_ieee` in
hyla/ops/dsa_indexer/kernels.py)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_moe_clamped_gpu import FORMS, check_clamped

pytestmark = interpreter.marks("test_moe_clamped_gpu.py")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("form", FORMS)
def test_clamped_forms(form: str, dtype: torch.dtype) -> None:
    if form == "grouped" and dtype == torch.bfloat16:
        pytest.skip("the interpreter's bf16 tl.dot (test_moe_clamped_gpu.py runs it)")
    T = {"gemv": 4, "gemv_shared": 5, "grouped": 21, "gathered": 3, "dense": 9}[form]
    check_clamped(form, T, dtype, "cpu")
