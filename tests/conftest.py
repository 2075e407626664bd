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


@pytest.fixture(autouse=True, scope="module")
def _triton_interpreter_only_where_asked(request):
    """tests/gpu/interpreter.py sets TRITON_INTERPRET=1 when it is imported, at collection, so
    with triton installed every later CPU engine test of the same process would run its short
    conv through the (slow) Triton interpreter: only the files that import it keep the flag.
    Module scope: an autouse fixture of the widest scope is set up first, so the flag is gone
    before any module-scoped fixture (a reference model run) computes with it."""
    from_interpreter = getattr(request.module, "interpreter", None)
    if "TRITON_INTERPRET" not in os.environ or getattr(from_interpreter, "marks", None) is not None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TRITON_INTERPRET")
        yield
