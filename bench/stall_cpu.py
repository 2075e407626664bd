"""How long one huge request stalls the other streams of a real `hyla serve` (issue 29).

For each configuration a `hyla serve` subprocess (embedded model, CPU) is started; a few
streaming completions run (ignore_eos, greedy) while a client in another process posts, one
after the other, `--reps` times each:

    messages_100k   /v1/chat/completions, 100,000 messages (3 MB)
    token_ids_1m    /v1/completions, a prompt of 1,000,000 token ids (6 MB)

Both are too long for the embedded model and must be refused quickly (400/413); what is
measured is the largest inter-token gap of the running streams from the send until 0.3 s
after the answer. The baseline is the same streams' largest gap over windows of the same
length with nothing else in flight, in the same server, same run. Figures: median and worst
over the repetitions; `ratio` = worst loaded max gap / baseline max gap; `excess_ms` = worst
loaded max gap - baseline max gap (the stall the big request adds).

Configurations (names as in the JSON; `--configs` picks some; the tokenizer pool the `_pool`
runs of bench/results/stall_cpu_before.json used is gone):
    core           the engine core in its own process (`hyla serve`)
    thread         --no-engine-core-process
    *_admitted     the same with --max-model-len 1048576: both requests are admitted (streamed,
                   the client leaves when the stream starts, so the server aborts them)

    python3 bench/stall_cpu.py                   # writes bench/results/stall_cpu.json
    python3 bench/stall_cpu.py --configs core thread --reps 5 --no-save
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from core_process_cpu import serve  # noqa: E402

CONFIGS = {
    "core": [],
    "thread": ["--no-engine-core-process"],
    # the same requests admitted (max_model_len 1M; 256-token steps keep the engine's own share of
    # their prefill small); the client leaves once the stream starts
    "core_admitted": ["--max-model-len", "1048576", "--kv-cache-memory", "3GiB",
                      "--max-num-batched-tokens", "256"],
    "thread_admitted": ["--max-model-len", "1048576", "--kv-cache-memory", "3GiB",
                        "--max-num-batched-tokens", "256",
                        "--no-engine-core-process"],
}
SETTLE_S = 0.3  # after the answer: time for a stalled stream to show its gap


class Stream(threading.Thread):
    """One streamed completion; `times` are the arrival times of its chunks."""

    def __init__(self, url: str, model: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.times: list[float] = []
        self.error: str | None = None
        self.response: httpx.Response | None = None

    def run(self) -> None:
        body = {"model": self.model, "prompt": "Once upon a time", "max_tokens": self.max_tokens,
                "ignore_eos": True, "stream": True, "temperature": 0}  # fmt: skip
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body,
                              timeout=600) as r:  # fmt: skip
                self.response = r
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        self.times.append(time.perf_counter())
        except Exception as e:  # noqa: BLE001 - closed by `close`, or the server failed
            self.error = repr(e)

    def close(self) -> None:
        """Disconnect: the server aborts the request (a drain then has nothing to wait for)."""
        if self.response is not None:
            self.response.close()


def big_requests(model: str) -> dict[str, tuple[str, bytes]]:
    chat = {"model": model, "messages": [{"role": "user", "content": "hello"}] * 100_000,
            "max_tokens": 1}  # fmt: skip
    ids = {"model": model, "prompt": [5] * 1_000_000, "max_tokens": 1}
    return {"messages_100k": ("/v1/chat/completions", json.dumps(chat).encode()),
            "token_ids_1m": ("/v1/completions", json.dumps(ids).encode())}  # fmt: skip


def sender(conn, model: str) -> None:  # noqa: ANN001
    """In its own process (its JSON and socket writes take no GIL from the stream readers):
    posts the named big request to each url it receives; answers (status, param, start, end)."""
    bodies = big_requests(model)
    conn.send({name: len(body) for name, (_, body) in bodies.items()})
    with httpx.Client(timeout=600) as client:
        while (job := conn.recv()) is not None:
            url, name, admitted = job
            path, body = bodies[name]
            if admitted:  # streamed: its response starts once the request is admitted
                body = body[:-1] + b', "stream": true}'
            headers = {"content-type": "application/json"}
            start = time.perf_counter()
            with client.stream("POST", url + path, content=body, headers=headers) as r:
                end = time.perf_counter()  # headers in: admitted (or refused)
                param = None
                if r.headers.get("content-type") == "application/json":
                    param = (json.loads(r.read()).get("error") or {}).get("param")
            conn.send((r.status_code, param, start, end))


def max_gap_ms(streams: list[Stream], start: float, end: float) -> float:
    """The largest gap between consecutive chunks of any stream overlapping [start, end]."""
    worst = 0.0
    for s in streams:
        t = np.asarray(s.times)
        if len(t) < 2:
            continue
        inside = (t[1:] >= start) & (t[:-1] <= end)
        if inside.any():
            worst = max(worst, float(np.diff(t)[inside].max() * 1e3))
    return worst


def measure(name: str, reps: int, num_streams: int, parent, model: str) -> dict:  # noqa: ANN001
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve(CONFIGS[name], Path(tmp) / "serve.log")
        try:
            max_model_len = httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"]
            streams = [Stream(url, model, min(max_model_len, 1 << 15) - 64)
                       for _ in range(num_streams)]  # fmt: skip
            for s in streams:
                s.start()
            while min(len(s.times) for s in streams) < 50:
                if any(s.error for s in streams) or proc.poll() is not None:
                    raise RuntimeError(f"streams failed: {[s.error for s in streams]}")
                time.sleep(0.02)
            time.sleep(1.0)
            rows: dict = {}
            windows: list[float] = []
            for big in ("messages_100k", "token_ids_1m"):
                runs = []
                for _ in range(reps):
                    # a quiet window first, as long as the last loaded one: the baseline
                    quiet = runs[-1]["latency_ms"] / 1e3 + SETTLE_S if runs else 0.5
                    t0 = time.perf_counter()
                    time.sleep(quiet)
                    windows.append(max_gap_ms(streams, t0, time.perf_counter()))
                    parent.send((url, big, name.endswith("_admitted")))
                    status, param, start, end = parent.recv()  # perf_counter is system-wide
                    time.sleep(SETTLE_S)
                    runs.append(
                        {
                            "status": status,
                            "param": param,
                            "latency_ms": (end - start) * 1e3,
                            "max_gap_ms": max_gap_ms(streams, start, end + SETTLE_S),
                        }
                    )
                gaps = [r["max_gap_ms"] for r in runs]
                rows[big] = {"runs": runs, "median_max_gap_ms": float(np.median(gaps)),
                             "worst_max_gap_ms": max(gaps)}  # fmt: skip
            all_gaps = np.concatenate([np.diff(s.times) for s in streams]) * 1e3
            base = {
                "max_gap_ms": max(windows),
                "median_window_max_gap_ms": float(np.median(windows)),
                "p50_gap_ms": float(np.median(all_gaps)),
            }
            for row in rows.values():
                row["ratio"] = row["worst_max_gap_ms"] / base["max_gap_ms"]
                row["excess_ms"] = row["worst_max_gap_ms"] - base["max_gap_ms"]
            alive = all(s.is_alive() for s in streams)
            return {"flags": CONFIGS[name], "max_model_len": max_model_len,
                    "num_streams": num_streams, "streams_alive": alive, "baseline": base,
                    **rows}  # fmt: skip
        finally:
            for s in locals().get("streams", []):
                s.close()
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--model", default="default", help="the served model name")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "stall_cpu.json"))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=sender, args=(child, args.model), daemon=True)
    proc.start()
    sizes = parent.recv()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "hyla"], capture_output=True,
                                text=True, cwd=ROOT).stdout.strip())  # fmt: skip
    report: dict = {
        "command": " ".join(["python3", *sys.argv]), "commit": commit,
        "hyla_tree_dirty": dirty,
        "hardware": f"{platform.processor() or platform.machine()}, "
                    f"{len(os.sched_getaffinity(0))} cpus",
        "load_average_at_start": os.getloadavg()[0], "request_bytes": sizes,
        "configs": {},
    }  # fmt: skip
    for name in args.configs:
        row = measure(name, args.reps, args.streams, parent, args.model)
        report["configs"][name] = row
        print(
            f"{name:12s} baseline max {row['baseline']['max_gap_ms']:7.1f} ms  "
            + "  ".join(
                f"{big}: {row[big]['runs'][0]['status']} worst {row[big]['worst_max_gap_ms']:7.1f}"
                f" ms (x{row[big]['ratio']:.2f}, +{row[big]['excess_ms']:.1f} ms)"
                for big in ("messages_100k", "token_ids_1m")
            ),
            flush=True,
        )
    parent.send(None)
    proc.join(timeout=10)
    if not args.no_save:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
