"""The varlen short-conv kernel on CPU tensors under TRITON_INTERPRET=1 (small shapes): the
checks of `test_short_conv_varlen_gpu.py` without a GPU, against `cpu.causal_conv1d`. Skipped as
the other interpreter tests are (run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_short_conv_varlen_gpu import CASES, check_conv_varlen

pytestmark = interpreter.marks("test_short_conv_varlen_gpu.py")


@pytest.mark.parametrize("lens,fresh", CASES)
def test_conv_varlen(lens, fresh) -> None:
    y_err, pool_err = check_conv_varlen(lens, fresh, 140, 4, torch.float32, "cpu")
    assert y_err <= 1e-5 and pool_err == 0.0


def test_conv_varlen_no_bias_sigmoid_width_3() -> None:
    y_err, pool_err = check_conv_varlen([3, 1, 6], [False, True, False], 130, 3, torch.float32,
                                        "cpu", activation="sigmoid", has_bias=False)  # fmt: skip
    assert y_err <= 1e-5 and pool_err == 0.0


def test_step_with_boundaries(monkeypatch) -> None:
    from tests.gpu.test_short_conv_varlen_gpu import check_step_with_boundaries

    y_err, pool_err = check_step_with_boundaries("cpu", monkeypatch)
    assert y_err <= 1e-5 and pool_err == 0.0
