"""The greedy kernel on CPU tensors under TRITON_INTERPRET=1: the checks of `test_greedy_gpu.py`
without a GPU (skipped as the other interpreter files are)."""

from __future__ import annotations

import pytest

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_greedy_gpu import check_greedy

pytestmark = interpreter.marks("test_greedy_gpu.py")


@pytest.mark.parametrize("vocab", [1, 7, 5000, 9000])  # one block, part of one, 2 and 3 blocks
def test_greedy(vocab: int) -> None:
    check_greedy(vocab, "cpu")
