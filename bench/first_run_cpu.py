"""A new user's first run on the CPU: `hyla generate` with the embedded model, and how fast a
typo errors (issue 16, item 7). Each figure is the wall time of a fresh `hyla` process.

    generate   `hyla generate "def fibonacci(n):"` (64 tokens), under three thread settings:
               policy   no thread variables: hyla's choice (hyla/engine/startup.py)
               1        OMP_NUM_THREADS=1 (the baseline every other figure is divided by)
               cores    OMP_NUM_THREADS=<cores>: torch's own default, what hyla ran before
               each on idle cores and beside one busy process (a Python spin loop) on them.
    typos      `--dtype bogus`, a missing path, a directory without config.json, and
               `hyla --version`: wall and CPU seconds to the error.

`--cpus 0,1` pins everything (the CLI and the busy process) to those cores with taskset, so a
many-core machine stands in for a 2-core one; the CUDA devices are hidden (CPU run).

    python3 bench/first_run_cpu.py --cpus 0,1          # writes bench/results/first_run_cpu.json
    python3 bench/first_run_cpu.py --reps 1 --no-save  # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "def fibonacci(n):"
TYPOS = {
    "dtype_bogus": ["generate", "--dtype", "bogus", PROMPT],
    "missing_path": ["generate", "/nonexistent/model", PROMPT],
    "dir_without_config": ["generate", "/", PROMPT],
    "version": ["--version"],
}


def hyla_cmd(args: list[str], cpus: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "hyla.cli", *args]
    return ["taskset", "-c", cpus, *cmd] if cpus else cmd


def env_with(threads: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    env["CUDA_VISIBLE_DEVICES"] = ""
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    return env


def timed(cmd: list[str], env: dict[str, str], timeout: float) -> dict:
    """Wall and CPU seconds of one process; its exit code and last stderr line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:  # reported as lasting `timeout` (a lower bound)
        rc, stderr = None, (e.stderr or b"").decode(errors="replace") + "\ntimed out"
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = stderr.strip().splitlines()
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "rc": rc,
            "stderr_tail": lines[-1] if lines else "",
            "startup": next((x for x in lines if x.startswith("hyla: model")), None)}  # fmt: skip


def busy(cpus: str | None) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "while True: pass"]
    return subprocess.Popen(["taskset", "-c", cpus, *cmd] if cpus else cmd)


def measure_generate(cpus: str | None, reps: int, timeout: float) -> dict:
    cores = str(len(cpus.split(","))) if cpus else str(os.cpu_count())
    settings = {"policy": None, "1": "1", "cores": cores}
    results: dict = {}
    for load in ("idle", "busy"):
        hog = busy(cpus) if load == "busy" else None
        try:
            for name, threads in settings.items():
                runs = [timed(hyla_cmd(["generate", PROMPT], cpus), env_with(threads), timeout)
                        for _ in range(reps)]  # fmt: skip
                results[f"{load}/{name}"] = {
                    "omp_num_threads": threads,
                    "wall_s_median": statistics.median(r["wall_s"] for r in runs),
                    "runs": runs,
                }
                print(load, name, [r["wall_s"] for r in runs], flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    for load in ("idle", "busy"):
        base = results[f"{load}/1"]["wall_s_median"]
        for name in settings:
            entry = results[f"{load}/{name}"]
            entry["ratio_vs_1_thread"] = round(entry["wall_s_median"] / base, 3)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpus", default=None, help="taskset core list, e.g. 0,1")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "first_run_cpu.json"))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    typos = {name: timed(hyla_cmd(a, args.cpus), env_with(None), args.timeout)
             for name, a in TYPOS.items()}  # fmt: skip
    for name, r in typos.items():
        print("typo", name, r["wall_s"], "s", r["stderr_tail"], flush=True)
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "commit": os.environ.get("HYLA_COMMIT") or _git_head(),
        "hardware": _hardware(args.cpus),
        "generate": measure_generate(args.cpus, args.reps, args.timeout),
        "typos": typos,
    }
    if not args.no_save:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print("wrote", args.out)


def _git_head() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _hardware(cpus: str | None) -> dict:
    cpu = platform.processor()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "pinned_cpus": cpus,
            "load_average_1m_at_start": os.getloadavg()[0],
            "python": platform.python_version()}  # fmt: skip


if __name__ == "__main__":
    main()
