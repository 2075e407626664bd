"""Served TPOT on the CPU with the engine core in its own process vs in the server's thread
(issue 29: "served c=1 on the CPU with the embedded model: TPOT no worse than the in-thread
engine"). `hyla serve` (embedded model) in each mode, alternating, `--reps` times; each run
`hyla bench serve` at c=1 and c=8 (128-word prompts, 64 tokens). Ratio = core process /
in-thread, from the medians over the repetitions of one run.

    python3 bench/core_process_cpu.py            # writes bench/results/serve_core_process_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODES = ("engine-core-process", "no-engine-core-process")
LOADS = {"c1": (1, 12), "c8": (8, 24)}  # concurrency, requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(flags: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """`hyla serve *flags` (embedded model) in a subprocess, once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "hyla.cli", "serve", "--port", str(port),
           "--disable-uvicorn-access-log", *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(480):
        if proc.poll() is not None:
            break
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"hyla serve {' '.join(flags)} not ready: {log.read_text()[-2000:]}")


def bench(url: str, concurrency: int, num: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "hyla.cli", "bench", "serve", "--url", url,
           "--concurrency", str(concurrency), "--num-requests", str(num), "--input-len", "128",
           "--output-len", "64", "--disable-tqdm", "--json", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    d = json.loads(out.read_text())
    pc = d["percentiles"]
    return {"tpot_p50_ms": pc["tpot_ms"]["p50"], "ttft_p50_ms": pc["ttft_ms"]["p50"],
            "output_tok_s": d["output_throughput"], "num_ok": d["num_ok"]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    runs: dict[str, dict[str, list[dict]]] = {m: {k: [] for k in LOADS} for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:  # alternate the order
                proc, url = serve([f"--{mode}"], Path(tmp) / f"{mode}.log")
                try:
                    for name, (c, n) in LOADS.items():
                        row = bench(url, c, n, Path(tmp) / f"{name}.json")
                        runs[mode][name].append(row)
                        print(mode, rep, name, row, flush=True)
                finally:
                    proc.send_signal(signal.SIGINT)
                    proc.wait(timeout=60)
    median = {m: {k: {f: float(np.median([r[f] for r in rows])) for f in rows[0]}
                  for k, rows in loads.items()} for m, loads in runs.items()}  # fmt: skip
    ratio = {k: median[MODES[0]][k]["tpot_p50_ms"] / median[MODES[1]][k]["tpot_p50_ms"]
             for k in LOADS}  # fmt: skip
    print("TPOT p50 ratio core process / in-thread:", {k: round(v, 3) for k, v in ratio.items()})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    result = {
        "command": " ".join(["python3", *sys.argv]), "commit": commit,
        "hardware": f"{platform.machine()}, {os.cpu_count()} cpus",
        "workload": "hyla serve (embedded model, CPU) with and without --engine-core-process, "
                    "hyla bench serve 128-word prompts / 64 tokens",
        "median": median, "tpot_ratio_core_process_vs_in_thread": ratio, "runs": runs,
    }  # fmt: skip
    if not args.no_save:
        out = ROOT / "bench" / "results" / "serve_core_process_cpu.json"
        out.write_text(json.dumps(result, indent=1))
        print("wrote", out)


if __name__ == "__main__":
    main()
