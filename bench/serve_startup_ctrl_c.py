"""One Ctrl-C at a random moment of `hyla serve`'s start-up (issue 41, item 1).

Each run starts `hyla serve` (embedded model, tokenizer pool of 1) in its own process group and
sends SIGINT to the group, as a terminal's Ctrl-C does, at a random moment: half of the runs
anywhere from launch to "Application startup complete." (of a first, uninterrupted run), half
within the application start-up itself (0-1.5 s after "Waiting for application startup.", where
the tokenizer pool's worker is spawned). A run passes when the process ends by itself within
the drain timeout plus the start-up's own length; the exit code and the time to exit are kept.

    python3 bench/serve_startup_ctrl_c.py     # 20 runs: results/serve_startup_ctrl_c_cpu.json
    python3 bench/serve_startup_ctrl_c.py --runs 2 --no-save
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP_STARTUP = "Waiting for application startup."
READY = "Application startup complete."


def start(drain_timeout: float) -> tuple[subprocess.Popen, list[tuple[float, str]], float]:
    cmd = [sys.executable, "-m", "hyla.cli", "serve", "--port", "0", "--max-model-len", "4096",
           "--drain-timeout", str(drain_timeout)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip()))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, t0


def wait_for(lines: list[tuple[float, str]], text: str, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for t, line in list(lines):
            if text in line:
                return t
        time.sleep(0.01)
    raise TimeoutError(f"no {text!r} within {timeout} s")


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def calibrate(drain_timeout: float) -> float:
    proc, lines, _ = start(drain_timeout)
    try:
        return wait_for(lines, READY)
    finally:
        kill_group(proc)


def one_run(kind: str, delay: float, drain_timeout: float, limit: float) -> dict:
    proc, lines, t0 = start(drain_timeout)
    try:
        if kind == "app_startup":
            wait_for(lines, APP_STARTUP)
        time.sleep(delay)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = None
        exit_s = time.monotonic() - sent
        ready = [t for t, line in lines if READY in line]
        return {"kind": kind, "delay_s": round(delay, 3), "signal_at_s": round(sent - t0, 2),
                "ready_at_s": round(ready[0], 2) if ready else None, "exit_code": code,
                "ended": code is not None, "exit_s": round(exit_s, 2),
                "printed_traceback": any("Traceback" in line for _, line in lines)}
    finally:
        kill_group(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    ready_s = calibrate(args.drain_timeout)
    limit = args.drain_timeout + ready_s + 10
    runs = []
    for i in range(args.runs):
        kind = "whole_startup" if i % 2 == 0 else "app_startup"
        delay = rng.uniform(0, ready_s) if kind == "whole_startup" else rng.uniform(0, 1.5)
        runs.append(one_run(kind, delay, args.drain_timeout, limit))
        print(json.dumps(runs[-1]), flush=True)
    num_ended = sum(r["ended"] for r in runs)
    print(f"{num_ended} of {len(runs)} Ctrl-C's ended hyla serve within {limit:.0f} s "
          f"(drain timeout {args.drain_timeout:g} s + start-up {ready_s:.1f} s + 10 s)")
    if args.no_save:
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    result = {"command": "python3 bench/serve_startup_ctrl_c.py " + " ".join(sys.argv[1:]),
              "commit": commit, "hardware": f"{platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs (shared)", "startup_s": round(ready_s, 2),
              "limit_s": round(limit, 1), "num_runs": len(runs), "num_ended": num_ended,
              "runs": runs}  # fmt: skip
    out = ROOT / "bench" / "results" / "serve_startup_ctrl_c_cpu.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
