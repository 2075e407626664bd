"""Suite-wide settings: one torch thread per test process.

CI runs `pytest -n 2` on 2 cores; more threads per worker only oversubscribe the machine (torch's
idle workers busy-wait), which made single files several times slower under load.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # bookkeeping-only environments
    pass


@pytest.fixture(autouse=True)
def _triton_interpreter_only_where_asked(request, monkeypatch):
    """tests/gpu/interpreter.py sets TRITON_INTERPRET=1 when it is imported, at collection, so
    with triton installed every later CPU engine test of the same process would run its short
    conv through the (slow) Triton interpreter: only the files that import it keep the flag."""
    from_interpreter = getattr(request.module, "interpreter", None)
    if "TRITON_INTERPRET" in os.environ and getattr(from_interpreter, "marks", None) is None:
        monkeypatch.delenv("TRITON_INTERPRET")
