"""One Ctrl-C at a random moment of `hyla serve`'s start-up ends the process (issue 41).

Ctrl-C in a terminal sends SIGINT to the whole process group: the server and the engine-core
process it spawns before the application start-up. Oracle: the process exits by itself,
within the drain timeout, with the code of a clean interrupt (0 after a drain, 130 while the
model is still loading), and no process of its group is left. The moments are drawn from a
seeded generator; every moment must end the process, so the outcome does not depend on speed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRAIN_TIMEOUT = 5.0
APP_STARTUP = "Waiting for application startup."
LOADING = "Loading weights"


def _ctrl_c_at(after_line: str, delay: float) -> tuple[int | None, str]:
    """Start `hyla serve`, send SIGINT to its process group `delay` s after it prints a line
    containing `after_line`; the exit code (None: still running after the drain timeout and
    the start-up's own time) and what it printed."""
    cmd = [sys.executable, "-m", "hyla.cli", "serve", "--port", "0", "--max-model-len", "4096",
           "--drain-timeout", str(DRAIN_TIMEOUT)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if after_line in line:
                seen.set()
        seen.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert seen.wait(120), "".join(lines)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            # the drain (nothing in flight), the rest of the start-up, the core's stop
            return proc.wait(timeout=DRAIN_TIMEOUT + 20), "".join(lines)
        except subprocess.TimeoutExpired:
            return None, "".join(lines)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group: a worker left behind too
        except ProcessLookupError:
            pass
        proc.wait()


MOMENTS = [(APP_STARTUP, round(random.Random(seed).uniform(0.0, 1.5), 3)) for seed in range(3)]


@pytest.mark.parametrize("after_line,delay", MOMENTS, ids=[f"startup+{d}s" for _, d in MOMENTS])
def test_one_ctrl_c_during_application_startup_ends_serve(after_line, delay):
    code, printed = _ctrl_c_at(after_line, delay)
    assert code == 0, f"exit code {code} (None: hung)\n{printed}"


def test_one_ctrl_c_while_loading_ends_serve_without_traceback():
    code, printed = _ctrl_c_at(LOADING, 0.0)
    assert code in (0, 130), f"exit code {code} (None: hung)\n{printed}"
    assert "Traceback" not in printed, printed
