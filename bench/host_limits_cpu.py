"""One huge request must not stall the other streams (issue 18, host work off the hot path).

A live `hyla serve` app (uvicorn in a thread, a tiny random-weight GDN/GQA model with the
embedded tokenizer, max_model_len 32768 as the embedded model's) streams one long completion
while a second client process sends, one after the other:

    messages_100k   a 3.8 MB chat request with 100,000 messages
    token_ids_1m    a completion request whose prompt is 1,000,000 token ids (3 MB)
    body_9mb        a 9 MB body (over the 8 MiB body limit)

For each it records the status, the client's latency, and the largest inter-token gap of the
running stream while the request was in flight (median and worst over the repetitions); the
baseline is the same stream's gaps with nothing else in flight, measured in the same run.
Ratio = worst loaded gap / unloaded p99 gap. The same requests are then sent with the size gate
turned off (`requests_without_size_gate`: validated, rendered, tokenized, then refused), the
same-run baseline. On a machine shared with other work the worst case mostly measures the
neighbours: compare the medians.

For the same requests against a real `hyla serve` (the engine core in its own process or in
a thread), measured from a client: `bench/stall_cpu.py`.

    python3 bench/host_limits_cpu.py                # writes bench/results/host_limits_cpu.json
    python3 bench/host_limits_cpu.py --no-save --max-model-len 131072  # 100k messages fit
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hyla.server import limits  # noqa: E402
from tests.server.conftest import MODEL, load_tokenizer, start_server, tiny_engine  # noqa: E402


def big_requests() -> dict[str, tuple[str, bytes]]:
    messages = [{"role": "user", "content": "hello"}] * 100_000
    chat = {"model": MODEL, "messages": messages, "max_tokens": 1}
    ids = {"model": MODEL, "prompt": [5] * 1_000_000, "max_tokens": 1}
    body = {"model": MODEL, "prompt": "x" * (9 << 20), "max_tokens": 1}
    return {
        "messages_100k": ("/v1/chat/completions", json.dumps(chat).encode()),
        "token_ids_1m": ("/v1/completions", json.dumps(ids).encode()),
        "body_9mb": ("/v1/completions", json.dumps(body).encode()),
    }


class Stream(threading.Thread):
    """One streamed completion; `times` are the arrival times of its chunks."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.times: list[float] = []

    def run(self) -> None:
        body = {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
        }
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.times.append(time.perf_counter())


def sender(conn: multiprocessing.connection.Connection) -> None:
    """In its own process (its JSON encoding and socket writes take no GIL from the server):
    posts each (url, body, until_headers) it receives, answers (status, param, start, end).
    `until_headers`: the connection is closed as soon as the response headers arrive (`end`)."""
    headers = {"content-type": "application/json"}
    with httpx.Client(timeout=600) as client:
        while (job := conn.recv()) is not None:
            url, body, until_headers = job
            start = time.perf_counter()
            with client.stream("POST", url, content=body, headers=headers) as r:
                end = time.perf_counter()
                if not until_headers or r.status_code != 200:
                    r.read()
                    end = time.perf_counter() if not until_headers else end
            param = None
            if r.headers.get("content-type") == "application/json":
                param = (r.json().get("error") or {}).get("param")
            conn.send((r.status_code, param, start, end))


def gaps_within(times: list[float], start: float, end: float) -> np.ndarray:
    t = np.asarray(times)
    inside = (t[1:] >= start) & (t[:-1] <= end)
    return np.diff(t)[inside]


def send_all(parent, url: str, stream: Stream, reps: int, gate: bool) -> dict:  # noqa: ANN001
    """Each big request `reps` times; `gate` False turns the size gate of `hyla.server.limits`
    off (the same-run baseline: the body is validated, rendered and tokenized first)."""
    saved = limits.check_chat_sizes, limits.check_completion_sizes
    if not gate:
        limits.check_chat_sizes = limits.check_completion_sizes = lambda *a: None
    try:
        return {name: send_one(parent, f"{url}{path}", body, stream, reps)
                for name, (path, body) in big_requests().items()}  # fmt: skip
    finally:
        limits.check_chat_sizes, limits.check_completion_sizes = saved


def send_one(parent, url: str, body: bytes, stream: Stream, reps: int) -> dict:  # noqa: ANN001
    runs = []
    for _ in range(reps):
        parent.send((url, body, False))
        status, param, start, end = parent.recv()  # perf_counter is system-wide
        time.sleep(0.3)  # let a stalled stream show its gap
        gaps = gaps_within(stream.times, start, end + 0.3)
        max_gap = float(gaps.max() * 1e3) if len(gaps) else 0.0
        runs.append({"status": status, "param": param, "latency_ms": (end - start) * 1e3,
                     "max_gap_ms": max_gap})  # fmt: skip
        time.sleep(0.5)
    gaps_ms = [x["max_gap_ms"] for x in runs]
    return {"bytes": len(body), "runs": runs, "median_gap_ms": float(np.median(gaps_ms)),
            "worst_gap_ms": max(gaps_ms)}  # fmt: skip


def measure(reps: int, max_model_len: int) -> dict:
    parent, child = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(target=sender, args=(child,))
    proc.start()  # forked before the server's threads exist
    tokenizer = load_tokenizer()
    engine = tiny_engine(tokenizer, max_model_len=max_model_len, kv_cache_memory=96 << 20)
    server = start_server(engine)
    stream = Stream(server.url, max_tokens=20_000)
    stream.start()
    while len(stream.times) < 50:
        time.sleep(0.01)
    time.sleep(2.0)
    base_start = stream.times[-1]
    time.sleep(3.0)
    base = gaps_within(stream.times, base_start, stream.times[-1])
    results: dict = {
        "unloaded": {
            "num_gaps": len(base),
            "p50_ms": float(np.median(base) * 1e3),
            "p99_ms": float(np.percentile(base, 99) * 1e3),
            "max_ms": float(base.max() * 1e3),
        },
    }
    for gate in (True, False):
        key = "requests" if gate else "requests_without_size_gate"
        results[key] = send_all(parent, server.url, stream, reps, gate)
        for row in results[key].values():
            row["ratio_vs_unloaded_p99"] = row["worst_gap_ms"] / results["unloaded"]["p99_ms"]
    parent.send(None)
    proc.join()
    server.async_engine.abort_all()
    server.stop()
    return results


def run_header() -> dict:
    """The figures' provenance: command, commit, CPU and count, load average at start."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": commit,
        "hardware": f"{platform.processor() or platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cpus",
        "load_average_at_start": os.getloadavg()[0],
    }

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    report = {**run_header(), "max_model_len": args.max_model_len,
              **measure(args.reps, args.max_model_len)}  # fmt: skip
    print(json.dumps(report, indent=1))
    if not args.no_save:
        out = ROOT / "bench" / "results" / "host_limits_cpu.json"
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
