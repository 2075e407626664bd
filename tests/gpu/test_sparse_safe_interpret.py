"""`test_sparse_safe_gpu.py`'s checks on CPU tensors under TRITON_INTERPRET=1 (run this file on
its own: see `tests/gpu/interpreter.py`)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_sparse_safe_gpu import NOPE, ROPE, check_safe_sparse_mla

pytestmark = interpreter.marks("test_sparse_safe_gpu.py")


@pytest.mark.parametrize("dims", [NOPE, ROPE], ids=["nope", "rope"])
def test_safe_sparse_mla(dims) -> None:
    assert check_safe_sparse_mla(dims, torch.float32, "cpu") <= 1e-5
