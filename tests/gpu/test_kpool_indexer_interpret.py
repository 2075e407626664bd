"""The pooled DSA indexer's kernels on CPU tensors under TRITON_INTERPRET=1: the checks of
`test_kpool_indexer_gpu.py` without a GPU. Skipped as `test_dsa_interpret.py` is (no triton,
CUDA present, or triton imported earlier without the flag: run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_kpool_indexer_gpu import CASES, check_topk, check_write_pool_keys

pytestmark = [
    *interpreter.marks("test_kpool_indexer_gpu.py"),
    # numpy warns about the masked lanes of softmaxes (-inf - -inf, 0 / 0) that tl.where discards
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize("every_token", [False, True], ids=["step", "every_token"])
@pytest.mark.parametrize("case", list(CASES))
def test_write_pool_keys(case: str, dtype: torch.dtype, every_token: bool) -> None:
    check_write_pool_keys(case, dtype, "cpu", every_token)


@pytest.mark.parametrize(
    ("case", "dtype", "tail", "static_shapes", "sort"),
    [("decode", torch.float32, True, False, True), ("decode", torch.bfloat16, True, True, False),
     ("decode", torch.float32, False, False, True), ("prefill", torch.float32, True, False, False),
     ("prefill", torch.bfloat16, False, False, True), ("kpool3", torch.float32, True, True, False),
     ("kpool3", torch.float32, False, False, True), ("kpool3", torch.bfloat16, True, False, True),
     ("few_pools", torch.float32, True, False, True),
     ("few_pools", torch.float32, True, True, False)],
)  # fmt: skip
def test_topk(case: str, dtype: torch.dtype, tail: bool, static_shapes: bool, sort: bool) -> None:
    check_topk(case, dtype, "cpu", tail, static_shapes, sort)


def test_sparse_mla_valid_selection() -> None:
    from tests.gpu.test_kpool_indexer_gpu import check_sparse_mla_valid_selection

    check_sparse_mla_valid_selection("cpu")
