"""The service under hostile and unlucky load (issue 40), embedded model, CPU.

    slow_headers   `hyla serve` under RLIMIT_NOFILE 1024 while N connections (default 1,100)
                   send a request head a byte every second: the latency of /health and of a
                   1-token completion meanwhile, and how long until each slow one is closed
                   (`--header-timeout`, 10 s by default);
    nodelay        /health and a 1-token completion on a kept-alive connection against a fresh
                   connection each (their medians: Nagle + delayed ACK cost ~40 ms before);
    long_prefill   in-process engine: a stream decodes while a long prompt (default 24,000
                   tokens) prefills; the stream's largest inter-token gap and the prompt's TTFT,
                   with the step time budget (`max_step_seconds`, default 1 s) and without it
                   (0: tokens only, the baseline of the same run).

    python3 bench/hostile_load_cpu.py                 # writes bench/results/hostile_load_cpu.json
    python3 bench/hostile_load_cpu.py --only nodelay --no-save
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SUITES = ("nodelay", "slow_headers", "long_prefill")


def serve(port: int, nofile: int | None, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    cmd = [sys.executable, "-m", "hyla.cli", "serve", "--port", str(port), "--log-level",
           "warning", *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, preexec_fn=limit,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("hyla serve did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def completion(client: httpx.Client, url: str) -> float:
    body = {"model": "default", "prompt": "Hi", "max_tokens": 1}
    start = time.perf_counter()
    r = client.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return time.perf_counter() - start


def health(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    assert client.get(f"{url}/health", timeout=60).status_code == 200
    return time.perf_counter() - start


def bench_nodelay(url: str, reps: int) -> dict:
    """Kept-alive and fresh requests alternate, so load from elsewhere hits both alike."""
    out = {}
    for name, fn in (("health", health), ("completion_1_token", completion)):
        kept = httpx.Client()
        fn(kept, url)
        kept_s, fresh_s = [], []
        for _ in range(reps):
            kept_s.append(fn(kept, url))
            with httpx.Client() as fresh:
                fresh_s.append(fn(fresh, url))
        kept.close()
        k, f = statistics.median(kept_s), statistics.median(fresh_s)
        out[name] = {"kept_alive_median_ms": k * 1e3, "fresh_median_ms": f * 1e3,
                     "kept_minus_fresh_ms": (k - f) * 1e3, "reps": reps}  # fmt: skip
    return out


def bench_slow_headers(port: int, num: int, header_timeout: float) -> dict:
    """`num` connections trickle a request head (a byte each per second); a selector sees
    when the server closes each one (EOF, or its 408 then EOF)."""
    url = f"http://127.0.0.1:{port}"
    sel = selectors.DefaultSelector()  # epoll: more than select()'s 1,024 descriptors
    opened: dict[socket.socket, float] = {}
    for _ in range(num):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            break
        s.setblocking(False)
        opened[s] = time.monotonic()
        sel.register(s, selectors.EVENT_READ)
    closed_after: list[float] = []
    stop = threading.Event()
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nUser-Agent: " + b"x" * 64

    def watch() -> None:
        i, next_byte = 0, time.monotonic()
        while not stop.is_set() and opened:
            for key, _ in sel.select(0.05):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    closed_after.append(time.monotonic() - opened.pop(s))
                    sel.unregister(s)
                    s.close()
            if time.monotonic() >= next_byte and i < len(head):
                for s in list(opened):
                    try:
                        s.send(head[i : i + 1])
                    except OSError:
                        pass
                i, next_byte = i + 1, next_byte + 1.0

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    time.sleep(1.0)
    health_s, completion_s = [], []
    for _ in range(10):
        with httpx.Client() as fresh:  # a new client must get a connection too
            health_s.append(health(fresh, url))
            completion_s.append(completion(fresh, url))
        time.sleep(0.2)
    deadline = time.monotonic() + header_timeout + 5
    while time.monotonic() < deadline and opened:
        time.sleep(0.2)
    stop.set()
    thread.join(5)
    still_open = len(opened)
    for s in list(opened):
        s.close()
    return {"connections_opened": len(closed_after) + still_open,
            "health_max_s": max(health_s), "completion_1_token_max_s": max(completion_s),
            "slow_closed": len(closed_after), "slow_still_open": still_open,
            "slow_closed_after_max_s": max(closed_after, default=None),
            "slow_closed_after_median_s": statistics.median(closed_after) if closed_after else None,
            "slow_closed_after_timeout": sum(t > header_timeout for t in closed_after),
            "header_timeout_s": header_timeout, "server_nofile": 1024}  # fmt: skip


def bench_long_prefill(prompt_tokens: int, budget: float) -> dict:
    import torch

    from hyla.engine.llm_engine import LLMEngine
    from hyla.request import SamplingParams

    torch.set_num_threads(1)
    engine = LLMEngine.from_path(None, device="cpu", max_step_seconds=budget,
                                 max_model_len=prompt_tokens + 512)  # fmt: skip
    vocab = engine.model.config.vocab_size if hasattr(engine, "model") else 1000
    greedy = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)
    engine.add_request("stream", [5, 6, 7, 8], greedy)
    for _ in range(5):
        engine.step()
    long_ids = [(i * 7919) % (vocab - 10) + 5 for i in range(prompt_tokens)]
    engine.add_request("long", long_ids, SamplingParams(temperature=0, max_tokens=1))
    start = last = time.monotonic()
    gaps, ttft = [], None
    while ttft is None:
        outs = engine.step()
        now = time.monotonic()
        for o in outs:
            if o.request_id == "stream":
                gaps.append(now - last)
                last = now
            elif o.request_id == "long" and ttft is None:
                ttft = now - start
    engine.abort_request("stream")
    return {"max_step_seconds": budget, "prompt_tokens": prompt_tokens, "ttft_s": ttft,
            "stream_max_gap_s": max(gaps), "stream_p99_gap_s": _p99(gaps),
            "stream_tokens_meanwhile": len(gaps)}  # fmt: skip


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=SUITES, action="append")
    ap.add_argument("--connections", type=int, default=1100)
    ap.add_argument("--header-timeout", type=float, default=10.0)
    ap.add_argument("--prompt-tokens", type=int, default=24000)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    suites = args.only or list(SUITES)
    results: dict = {}
    if "nodelay" in suites or "slow_headers" in suites:
        port = free_port()
        proc = serve(port, 1024, "--header-timeout", str(args.header_timeout))
        try:
            if "nodelay" in suites:
                results["nodelay"] = bench_nodelay(f"http://127.0.0.1:{port}", args.reps)
            if "slow_headers" in suites:
                results["slow_headers"] = bench_slow_headers(port, args.connections,
                                                             args.header_timeout)
        finally:
            proc.terminate()
            proc.wait(30)
    if "long_prefill" in suites:
        with_budget = bench_long_prefill(args.prompt_tokens, 1.0)
        baseline = bench_long_prefill(args.prompt_tokens, 0.0)
        results["long_prefill"] = {
            "budget": with_budget, "tokens_only": baseline,
            "ttft_cost": with_budget["ttft_s"] / baseline["ttft_s"] - 1,
        }
    record = {"command": " ".join([sys.executable, *sys.argv]), "commit": _git_head(),
              "hardware": {"cpu_count": os.cpu_count(), "machine": platform.machine(),
                           "processor": platform.processor() or platform.machine()},
              "results": results}  # fmt: skip
    text = json.dumps(record, indent=2)
    print(text)
    if not args.no_save:
        out = ROOT / "bench" / "results" / "hostile_load_cpu.json"
        out.write_text(text + "\n")


def _git_head() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                       text=True).strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
