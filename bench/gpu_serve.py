"""`hyla serve` under load on one GPU, against the offline engine on the same model, same run.

The ~1.5B Kimi-Linear-shaped checkpoint of bench/gpu_e2e.py (random bf16 weights, vocab 8192)
is saved with the embedded model's tokenizer to a temp dir; `hyla serve` runs on it as a
subprocess and `hyla bench serve` (also a subprocess, --json) drives it:

    concurrency 1, 16, 64        512-word prompts, 128 output tokens (ignore_eos)
    concurrency 128              1024 / 256
    Poisson request rates        512 / 128 at --rates req/s (up to 128 in flight)

after one unrecorded warm-up run (first requests compile kernels). Then the server stops and the
offline engine (`LLMEngine`, the same engine options) decodes the same prompt/output lengths at
batch = each concurrency. Per scenario the JSON holds served output tok/s, TTFT / TPOT / ITL /
E2E percentiles and

    served decode tok/s = concurrency / TPOT p50          (each stream's token rate, summed)
    server efficiency   = served decode tok/s / offline decode tok/s at that batch
                        = offline step time / TPOT p50

Fits one 10-minute command on an H200 (--quick: fewer requests, about half the time).

    PYTHONPATH=. python3 bench/gpu_serve.py [--quick] [--out-dir $OUT]
    PYTHONPATH=. python3 bench/gpu_serve.py --smoke       # CPU, tiny model, a bug check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(REPO))

import gpu_e2e  # noqa: E402

TOKENIZER_DIR = REPO / "hyla" / "assets" / "default_model"


@dataclass(frozen=True)
class Scenario:
    name: str
    concurrency: int
    num_requests: int
    input_len: int
    output_len: int
    request_rate: float = float("inf")


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    n = (lambda full, quick: quick) if args.quick else (lambda full, quick: full)
    if args.smoke:
        return [Scenario("c1", 1, 2, 16, 4), Scenario("c4", 4, 4, 16, 4),
                Scenario("rate8", 4, 4, 16, 4, 8.0)]  # fmt: skip
    rows = [
        Scenario("c1", 1, n(16, 6), 512, 128),
        Scenario("c16", 16, n(64, 32), 512, 128),
        Scenario("c64", 64, n(256, 128), 512, 128),
        Scenario("c128_1024_256", 128, n(256, 128), 1024, 256),
    ]
    for rate in args.rates:
        rows.append(Scenario(f"rate{rate:g}", 128, n(192, 96), 512, 128, rate))
    if args.scenarios:
        rows = [r for r in rows if r.name in args.scenarios]
    return rows


def engine_options(args: argparse.Namespace) -> dict:
    """The server's and the offline engine's options: the bench's, then `--engine-option`s."""
    options = dict(
        device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.chunk, max_model_len=args.max_model_len,
        kv_cache_memory=args.kv_cache_gib << 30,
    )  # fmt: skip
    for item in args.engine_option:
        key, _, value = item.partition("=")
        options[key.replace("-", "_")] = json.loads(value) if value[:1] in "0123456789tf[{-" \
            else value  # fmt: skip
    return options


def build_checkpoint(args: argparse.Namespace, path: Path) -> int:
    """Save gpu_e2e's model and the embedded tokenizer to `path`; returns the parameter count."""
    hf = gpu_e2e.build_hf_model(args, getattr(torch, args.dtype))
    num_params = sum(p.numel() for p in hf.parameters())
    hf.save_pretrained(path, safe_serialization=True)
    del hf
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, path / name)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return num_params


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "hyla.cli", *argv]


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_server(args: argparse.Namespace, path: Path, log: Path,
                 extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """`hyla serve` on a free port; returns once /health answers (or raises RuntimeError)."""
    import httpx

    port = free_port()
    flags = []
    for key, value in engine_options(args).items():
        flag = key.replace("_", "-")
        flags.append(f"--{'' if value else 'no-'}{flag}" if isinstance(value, bool)
                     else f"--{flag}={value}")  # fmt: skip
    cmd = cli("serve", str(path), "--port", str(port), "--log-level", "warning", *flags, *extra)
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=child_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"hyla serve exited with {proc.returncode}: {tail(log)}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_server(proc)
    raise RuntimeError(f"hyla serve not ready after {args.start_timeout} s: {tail(log)}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def bench_serve(url: str, s: Scenario, out: Path, timeout: float, seed: int) -> dict:
    """One `hyla bench serve` run; its JSON, or {"error": ...}."""
    cmd = cli("bench", "serve", "--url", url, "--num-requests", str(s.num_requests),
              "--concurrency", str(s.concurrency), "--input-len", str(s.input_len),
              "--output-len", str(s.output_len), "--request-rate", str(s.request_rate),
              "--seed", str(seed), "--disable-tqdm", "--json", str(out))  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    print(done.stdout, flush=True)
    if done.returncode != 0 or not out.exists():
        return {"error": f"exit {done.returncode}: {(done.stdout + done.stderr)[-1000:]}"}
    return json.loads(out.read_text())


def served_phase(args: argparse.Namespace, path: Path, work: Path,
                 extra: tuple[str, ...] = ()) -> dict:
    log = work / "server.log"
    rows: dict = {"serve_flags": list(extra)}
    try:
        proc, url = start_server(args, path, log, extra)
    except RuntimeError as e:
        return {"error": str(e)}
    try:
        warm = Scenario("warmup", 8, 16 if not args.smoke else 2, 512 if not args.smoke else 16, 8)
        rows["warmup"] = summary(bench_serve(url, warm, work / "warm.json", args.timeout, 99))
        for i, s in enumerate(scenarios(args)):  # own prompts: no prefix hit across scenarios
            before = step_counters(url) if args.profile else None
            t0 = time.perf_counter()
            raw = bench_serve(url, s, work / f"{s.name}.json", args.timeout, args.seed + 1000 * i)
            rows[s.name] = {"scenario": s.__dict__, **summary(raw)}
            rows[s.name]["wall_s"] = time.perf_counter() - t0
            if before is not None:
                rows[s.name]["steps"] = step_split(before, step_counters(url), raw)
            if proc.poll() is not None:
                rows["error"] = f"server died: {tail(log)}"
                break
    finally:
        stop_server(proc)
        rows["server_log_tail"] = tail(log)
    return rows


def step_counters(url: str) -> dict[tuple[str, str], float]:
    """The server's per-path step counters (`hyla_engine_{steps,launch_seconds,device_seconds}`)."""
    import httpx

    counters = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        for key in ("steps", "launch_seconds", "device_seconds"):
            head = f'hyla_engine_{key}_total{{path="'
            if line.startswith(head):
                path = line[len(head) : line.index('"', len(head))]
                counters[(key, path)] = float(line.split()[-1])
    return counters


def step_split(before: dict, after: dict, raw: dict) -> dict:
    """Per path over one scenario: steps, host ms to launch one, device ms one spans; and the
    share of the scenario's duration the device spent inside steps (1 - that is host-bound)."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    paths = sorted({p for _, p in delta})
    split = {}
    for p in paths:
        n = delta.get(("steps", p), 0.0)
        split[p] = dict(steps=n, launch_ms=1e3 * delta.get(("launch_seconds", p), 0.0) / max(n, 1),
                        device_ms=1e3 * delta.get(("device_seconds", p), 0.0) / max(n, 1))
    busy = sum(delta.get(("device_seconds", p), 0.0) for p in paths)
    duration = raw.get("duration") or 0.0
    split["device_busy_share"] = busy / duration if duration else None
    print("steps: " + ", ".join(f"{p} {v['steps']:.0f} x ({v['launch_ms']:.2f} ms host, "
          f"{v['device_ms']:.2f} ms device)" for p, v in split.items() if isinstance(v, dict))
          + f"; device busy {split['device_busy_share'] or 0:.0%}", flush=True)  # fmt: skip
    return split


def summary(raw: dict) -> dict:
    if "error" in raw:
        return raw
    keys = ("num_ok", "num_failed", "prompt_tokens", "output_tokens", "duration",
            "output_throughput", "request_throughput", "percentiles", "errors")  # fmt: skip
    return {k: raw[k] for k in keys}


def offline_phase(args: argparse.Namespace, path: Path, served: dict) -> dict:
    """Decode tok/s of the offline engine at batch = each scenario's concurrency, prompts as long
    (in tokens) as the server counted for that scenario."""
    from hyla.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_path(str(path), **engine_options(args))
    rows = {}
    for s in scenarios(args):
        if s.request_rate != float("inf"):
            continue
        got = served.get(s.name, {})
        ok = got.get("num_ok") or 0
        prompt_len = round(got["prompt_tokens"] / ok) if ok else s.input_len
        prompts = gpu_e2e.random_prompts(s.concurrency, prompt_len, args.vocab, seed=3)
        gpu_e2e.run_engine(engine, prompts, 8, args.device, f"warm-{s.name}")
        t = gpu_e2e.run_engine(engine, prompts, s.output_len, args.device, f"off-{s.name}")
        step_s = t["decode_s"] / max(t["decode_steps"], 1)
        rows[s.name] = dict(batch=s.concurrency, prompt_len=prompt_len,
                            decode_steps=t["decode_steps"], step_ms=1e3 * step_s,
                            decode_tok_s=s.concurrency / step_s)  # fmt: skip
        print(f"offline {s.name}: B={s.concurrency} decode {rows[s.name]['decode_tok_s']:.0f} "
              f"tok/s ({1e3 * step_s:.2f} ms a step)", flush=True)  # fmt: skip
    return rows


def efficiency(served: dict, offline: dict) -> dict:
    out = {}
    for name, off in offline.items():
        tpot_ms = served.get(name, {}).get("percentiles", {}).get("tpot_ms", {}).get("p50")
        if not tpot_ms:
            continue
        decode = off["batch"] / (tpot_ms / 1e3)
        out[name] = dict(served_decode_tok_s=decode, offline_decode_tok_s=off["decode_tok_s"],
                         server_efficiency=decode / off["decode_tok_s"])  # fmt: skip
        print(f"{name}: served decode {decode:.0f} tok/s / offline {off['decode_tok_s']:.0f} "
              f"= efficiency {decode / off['decode_tok_s']:.2f}")  # fmt: skip
    return out


def goals(served: dict, offline: dict) -> dict:
    def pct(name: str, metric: str, q: str) -> float | None:
        return served.get(name, {}).get("percentiles", {}).get(metric, {}).get(q)

    def thr(name: str) -> float:
        return served.get(name, {}).get("output_throughput", 0.0)

    c64_tpot, c16_tpot = pct("c64", "tpot_ms", "p50"), pct("c16", "tpot_ms", "p50")
    c1_ttft, c1_tpot = pct("c1", "ttft_ms", "p99"), pct("c1", "tpot_ms", "p50")
    return {
        "c64_output_ge_12000": thr("c64") >= 12000,
        "c64_tpot_p50_le_4ms": c64_tpot is not None and c64_tpot <= 4.0,
        "c16_tpot_p50_le_2ms": c16_tpot is not None and c16_tpot <= 2.0,
        "c1_ttft_p99_le_150ms": c1_ttft is not None and c1_ttft <= 150.0,
        "c1_tpot_p50_le_0.9ms": c1_tpot is not None and c1_tpot <= 0.9,
        "c128_output_ge_15000": thr("c128_1024_256") >= 15000,
    }


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = work / "model"
        t0 = time.perf_counter()
        num_params = build_checkpoint(args, path)
        print(f"checkpoint: {num_params / 1e9:.3f} B parameters, {time.perf_counter() - t0:.0f} s")
        served = served_phase(args, path, work)
        in_thread = None
        if args.compare_in_thread:  # the engine in the server's process, as before issue 29
            in_thread = served_phase(args, path, work, ("--no-engine-core-process",))
        if args.out_dir:  # the server's log, for a look at what went wrong
            Path(args.out_dir).mkdir(parents=True, exist_ok=True)
            log_tail = served.get("server_log_tail", served.get("error", ""))
            (Path(args.out_dir) / "gpu_serve_server.log").write_text(log_tail)
        try:
            offline = {"error": "skipped"} if args.skip_offline else \
                offline_phase(args, path, served)
        except Exception as e:  # noqa: BLE001 - the served numbers still get written
            offline = {"error": f"{type(e).__name__}: {e}"}
    eff = efficiency(served, offline) if "error" not in offline else {}
    out = dict(parameters=num_params, served=served, offline=offline, efficiency=eff,
               goals=goals(served, offline) if not args.smoke else None)  # fmt: skip
    if in_thread is not None:
        out["served_in_thread"] = in_thread
        out["core_process_vs_in_thread"] = versus(served, in_thread)
    return out


def versus(served: dict, in_thread: dict) -> dict:
    """Per scenario: output tok/s and TPOT p50 of the core process over the in-thread engine."""
    rows = {}
    for name, row in served.items():
        other = in_thread.get(name)
        if not isinstance(row, dict) or not isinstance(other, dict) or "percentiles" not in row \
                or "percentiles" not in other:
            continue
        tpot, tpot0 = row["percentiles"]["tpot_ms"]["p50"], other["percentiles"]["tpot_ms"]["p50"]
        rows[name] = dict(output_tok_s=row["output_throughput"],
                          output_tok_s_in_thread=other["output_throughput"],
                          throughput_ratio=row["output_throughput"] / other["output_throughput"],
                          tpot_p50_ms=tpot, tpot_p50_ms_in_thread=tpot0,
                          tpot_ratio=tpot / tpot0 if tpot0 else None)  # fmt: skip
        print(f"{name}: core process {row['output_throughput']:.0f} tok/s, TPOT {tpot:.2f} ms; "
              f"in-thread {other['output_throughput']:.0f} tok/s, TPOT {tpot0:.2f} ms")
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, fp32: a bug check")
    p.add_argument("--quick", action="store_true", help="fewer requests per scenario")
    p.add_argument("--profile", action="store_true",
                   help="per scenario: the server's steps by path, host ms to launch and device "
                        "ms per step, and the device's busy share (from /metrics)")
    p.add_argument("--rates", default="8,32", help="Poisson request rates (req/s), comma list")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=4096, help="1024 words: ~1700 tokens")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--timeout", type=float, default=240.0, help="per bench serve run")
    p.add_argument("--out", default=str(ROOT / "results" / "gpu_serve_h200.json"))
    p.add_argument("--out-dir", default=None, help="also copy the JSON here (e.g. $OUT)")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an EngineConfig field for both sides (e.g. enable_prefix_caching=false)")
    p.add_argument("--compare-in-thread", action="store_true",
                   help="serve the scenarios again with --no-engine-core-process (same run)")
    p.add_argument("--skip-offline", action="store_true", help="served phases only")
    p.add_argument("--scenarios", type=lambda v: v.split(","), default=None,
                   help="only these scenarios (names as in the JSON), comma list")
    own, rest = p.parse_known_args(argv)
    model = gpu_e2e.parse_args(["--vocab", "8192", *rest, *(["--smoke"] if own.smoke else [])])
    for key, value in vars(own).items():
        setattr(model, key, value)
    model.rates = [float(r) for r in own.rates.split(",") if r]
    model.no_save = own.no_save or own.smoke
    if own.smoke:
        model.vocab, model.max_num_seqs, model.max_model_len, model.rates = 8192, 8, 128, []
    return model


def main() -> None:
    args = parse_args()
    gpu_e2e.run_and_record("bench/gpu_serve.py", args, run)


if __name__ == "__main__":
    main()
