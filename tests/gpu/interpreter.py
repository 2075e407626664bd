"""The preamble of the Triton-interpreter tests (`tests/gpu/*_interpret.py`,
`tests/ops/test_dsa_radix_topk.py`): import it before anything that imports triton. Without
CUDA it sets TRITON_INTERPRET=1, so the kernels run on CPU tensors; `marks` skips a file when
triton is missing (CI), when CUDA is present (its `*_gpu.py` runs the compiled kernels), and when
triton was imported earlier in the process without the flag (then run the file on its own)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

PRELOADED = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not torch.cuda.is_available() and not PRELOADED:
    os.environ["TRITON_INTERPRET"] = "1"


def marks(gpu_tests: str) -> list[pytest.MarkDecorator]:
    """The skip marks of an interpreter test file whose compiled twin is `gpu_tests`."""
    return [
        pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton"),
        pytest.mark.skipif(torch.cuda.is_available(), reason=f"CUDA present: see {gpu_tests}"),
        pytest.mark.skipif(PRELOADED, reason="triton imported without TRITON_INTERPRET: run alone"),
    ]
