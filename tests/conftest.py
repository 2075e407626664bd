"""Suite-wide settings: one torch thread per test process.

CI runs `pytest -n 2` on 2 cores; more threads per worker only oversubscribe the machine (torch's
idle workers busy-wait), which made single files several times slower under load.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # bookkeeping-only environments
    pass
