"""The paged prefill GQA kernel on CPU tensors under TRITON_INTERPRET=1 (small shapes, fp32):
the checks of `test_gqa_gpu.py` without a GPU, against the dense masked reference. Skipped as the
other interpreter tests are (run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_gqa_gpu import CASES, check_paged_gqa

pytestmark = interpreter.marks("test_gqa_gpu.py")


@pytest.mark.parametrize("q_lens,contexts", CASES)
def test_paged_gqa(q_lens, contexts) -> None:
    assert check_paged_gqa(q_lens, contexts, (4, 2), (32, 16), torch.float32, "cpu") <= 1e-5


def test_paged_gqa_uneven_head_dims_and_tensor_lengths() -> None:
    err = check_paged_gqa([20, 1], [7, 2], (3, 1), (24, 40), torch.float32, "cpu", page=8,
                          lens_as_tensor=True)  # fmt: skip
    assert err <= 1e-5
