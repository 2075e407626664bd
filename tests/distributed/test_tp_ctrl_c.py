"""Ctrl-C of a CPU `hyla serve --tensor-parallel-size 2` (issue 41, item 6).

The engine process exits by `os._exit` after its drain; rank 1, waiting for the next plan,
then sees the gloo connection closed. Oracle: the exit code (0) and the whole output of the
process group (rank 1's included: it holds the same pipe), which holds no traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_of_a_tp_server_prints_no_rank_traceback():
    cmd = [sys.executable, "-m", "hyla.cli", "serve", "--port", "0", "--max-model-len", "512",
           "--tensor-parallel-size", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Application startup complete" in line:
                break
        assert proc.poll() is None, "".join(lines)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        rest, _ = proc.communicate(timeout=60)  # EOF once rank 1 is gone too
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest and "failed" not in rest, rest
