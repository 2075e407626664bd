"""Where a decode step's time goes, on the model of bench/gpu_e2e.py (a tuning aid, not a goal).

For each batch size: the engine's mean step time (scheduler, input copies, graph replay, logits,
sampler), the captured graph's replay alone, and a torch.profiler table of the GPU kernels of a
few replays (by total CUDA time), written to --out-dir as profile_B<b>.txt.

    PYTHONPATH=. python3 bench/gpu_profile_decode.py --out-dir "$OUT"
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_e2e import build_hf_model, hyla_engine, parse_args, random_prompts  # noqa: E402

from hyla.request import SamplingParams  # noqa: E402


def replay_ms(graph: torch.cuda.CUDAGraph, iters: int = 50) -> float:
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / iters


def profile_batch(engine, args: argparse.Namespace, b: int, out_dir: Path) -> None:
    prompts = random_prompts(b, args.prompt_len, args.vocab, seed=b)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"p{b}-{i}", p, params)
    for _ in range(8):  # prefill and a few decode steps (captures the graph)
        engine.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    steps = 20
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    step_ms = 1e3 * (time.perf_counter() - t0) / steps
    graphs = engine.runner.graphs
    static = max(graphs.steps.values(), key=lambda s: (s.size >= b, -s.size))
    graph_ms = replay_ms(static.graph)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            static.graph.replay()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    saved = engine.runner.graphs
    engine.runner.graphs = None
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as eager_prof:
        for _ in range(3):
            engine.step()
        torch.cuda.synchronize()
    engine.runner.graphs = saved
    eager_table = eager_prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    while engine.has_unfinished_requests():
        engine.step()
    head = (f"B={b}: engine step {step_ms:.3f} ms, graph replay {graph_ms:.3f} ms "
            f"(graph batch {static.size}, context bucket {static.batch.max_seq_len})")  # fmt: skip
    print(head, flush=True)
    text = f"{head}\n\n== kernels of 5 graph replays\n{table}\n\n== 3 eager steps\n{eager_table}\n"
    (out_dir / f"profile_B{b}.txt").write_text(text)
    print(table[:6000], flush=True)


def main() -> None:
    args = parse_args(sys.argv[1:] + ["--no-save", "--skip-hf"])
    out_dir = Path(args.out_dir or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = build_hf_model(args, getattr(torch, args.dtype))
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        engine = hyla_engine(tmp, args)
    del hf
    for b in args.batches:
        profile_batch(engine, args, b, out_dir)


if __name__ == "__main__":
    main()
