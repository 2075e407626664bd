"""Where a decode step's time goes, on the model of bench/gpu_e2e.py (a tuning aid, not a goal).

For each batch size: the engine's mean step time (scheduler, input copies, graph replay, logits,
sampler), the captured graph's replay alone, and a torch.profiler table of the GPU kernels of a
few replays (by total CUDA time), the same for eager steps, and the eager steps' kernel time per
module path (forward hooks open a profiler range per module), written to --out-dir as
profile_B<b>.txt.

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


def module_labels(model: torch.nn.Module) -> list:
    """Forward hooks that wrap every submodule's forward in a profiler range named after its path
    with layer indices folded ("@layers.*.mlp.experts"); returns the hook handles."""
    handles = []
    for name, module in model.named_modules():
        label = "@" + ".".join("*" if part.isdigit() else part for part in name.split("."))
        ranges: list = []

        def pre(_m, _a, label=label, ranges=ranges):
            ranges.append(torch.profiler.record_function(label))
            ranges[-1].__enter__()

        def post(_m, _a, _o, ranges=ranges):
            ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


def by_module_table(prof, steps: int) -> str:
    """Kernel time per step (us) and kernels per step under each module path of `module_labels`
    (a module's figure includes its children's)."""
    time_us: dict[str, float] = {}
    kernels: dict[str, int] = {}
    for e in prof.events():
        if e.name.startswith("@"):
            time_us[e.name] = time_us.get(e.name, 0.0) + e.device_time_total
            kernels[e.name] = kernels.get(e.name, 0) + sum(1 for _ in _descendant_kernels(e))
    lines = [f"{'module':60s} {'us/step':>9s} {'kernels/step':>12s}"]
    for name in sorted(time_us):
        lines.append(f"{name:60s} {time_us[name] / steps:9.1f} {kernels[name] / steps:12.1f}")
    return "\n".join(lines)


def _descendant_kernels(event):
    for child in event.cpu_children:
        yield from _descendant_kernels(child)
    yield from getattr(event, "kernels", [])


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
    eager_table = eager_prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    handles = module_labels(engine.runner.model)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as module_prof:
        for _ in range(3):
            engine.step()
        torch.cuda.synchronize()
    for h in handles:
        h.remove()
    module_table = by_module_table(module_prof, 3)
    engine.runner.graphs = saved
    while engine.has_unfinished_requests():
        engine.step()
    head = (f"B={b}: engine step {step_ms:.3f} ms, graph replay {graph_ms:.3f} ms "
            f"(graph batch {static.size}, context bucket {static.batch.max_seq_len})")  # fmt: skip
    print(head, flush=True)
    text = (f"{head}\n\n== kernels of 5 graph replays\n{table}\n\n== 3 eager steps\n{eager_table}\n"
            f"\n== kernel time by module (eager steps)\n{module_table}\n")  # fmt: skip
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
