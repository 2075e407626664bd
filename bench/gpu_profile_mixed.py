"""Where a prefill or mixed prefill+decode step's time goes, on the model of bench/gpu_e2e.py
(a tuning aid for issue 18's serving goals, not a goal itself).

Scenarios, each after a warm-up pass of the same shapes:

    prefill    8 prompts x 1024 tokens in one 8192-token step (what a burst of arrivals costs)
    prefill_pc the same with prefix caching on, as `hyla serve` runs (checkpoint rounds)
    mixed      64 decoding requests + one 512-token prefill chunk (the steady state under load)
    burst      64 prompts x 850 tokens at once, prefix caching on: the first 6 (eager) steps of
               `hyla bench serve`'s c=64 wave
    decode     the same 64 requests, decode only (CUDA graphs: the ceiling the mixed step misses)

For each: engine step wall time, the GPU kernel time inside it (torch.profiler), so
host share = 1 - kernel time / wall time, and the top kernels and host ops, written to
--out-dir as profile_mixed_<scenario>.txt with a summary JSON.

    PYTHONPATH=. python3 bench/gpu_profile_mixed.py --out-dir "$OUT"
    PYTHONPATH=. python3 bench/gpu_profile_mixed.py --smoke     # CPU, tiny model, a bug check
    ... --stacks: also profile_mixed_<scenario>_stacks.txt, host ops by Python call site
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_e2e import build_hf_model, environment, git_commit, random_prompts  # noqa: E402

from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402

SMOKE = "--smoke" in sys.argv
STACKS = "--stacks" in sys.argv  # also each scenario's top host ops by Python call site
DEVICE = "cpu" if SMOKE else "cuda"
ACT = [torch.profiler.ProfilerActivity.CPU] + (
    [] if SMOKE else [torch.profiler.ProfilerActivity.CUDA]
)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _engine(path: str, prefix_caching: bool = False) -> LLMEngine:
    return LLMEngine.from_path(
        path, device=DEVICE, dtype="float32" if SMOKE else "bfloat16", max_num_seqs=128,
        max_num_batched_tokens=8192, max_model_len=4096,
        enable_prefix_caching=prefix_caching, kv_cache_memory=8 << 30,
    )  # fmt: skip


def _drain(engine: LLMEngine) -> None:
    while engine.has_unfinished_requests():
        engine.step()
    engine.flush()


def _timed(engine: LLMEngine, steps: int) -> float:
    _sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync()
    return 1e3 * (time.perf_counter() - t0) / steps


def _kernel_ms(prof) -> float:
    events = prof.key_averages()
    return sum(e.self_device_time_total for e in events) / 1e3


def _profile(engine: LLMEngine, steps: int, name: str, out_dir: Path, wall_ms: float) -> dict:
    with torch.profiler.profile(activities=ACT, with_stack=STACKS) as prof:
        for _ in range(steps):
            engine.step()
        _sync()
    kernel_ms = _kernel_ms(prof) / steps
    gpu = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30)
    cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    head = (f"{name}: step {wall_ms:.2f} ms wall, {kernel_ms:.2f} ms of GPU kernels "
            f"(host share {1 - kernel_ms / wall_ms:.0%})")  # fmt: skip
    print(head, flush=True)
    print(gpu[:5000], flush=True)
    print(cpu[:4000], flush=True)
    (out_dir / f"profile_mixed_{name}.txt").write_text(f"{head}\n\n{gpu}\n\n{cpu}\n")
    if STACKS:
        by_site = prof.key_averages(group_by_stack_n=8).table(
            sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60
        )
        (out_dir / f"profile_mixed_{name}_stacks.txt").write_text(by_site)
    return {"step_ms": wall_ms, "kernel_ms": kernel_ms, "host_share": 1 - kernel_ms / wall_ms}


def prefill(engine: LLMEngine, out_dir: Path, vocab: int, name: str = "prefill") -> dict:
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for rep in range(3):  # two warm-up passes, then the measured one
        for i, p in enumerate(random_prompts(8, 1024, vocab, seed=rep)):
            engine.add_request(f"pf{rep}-{i}", p, params)
        if rep < 2:
            _drain(engine)
    wall = _timed(engine, 1)
    _drain(engine)
    for i, p in enumerate(random_prompts(8, 1024, vocab, seed=9)):
        engine.add_request(f"pfp-{i}", p, params)
    row = _profile(engine, 1, name, out_dir, wall)
    _drain(engine)
    return row


def burst(engine: LLMEngine, out_dir: Path, vocab: int) -> dict:
    """64 prompts x 850 tokens arriving at once, as `hyla bench serve`'s c=64 wave: 8192-token
    eager steps, from the second on beside the decode rows of the requests admitted before."""
    n, length = (8, 100) if SMOKE else (64, 850)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

    def wave(tag: str, seed: int) -> None:
        for i, p in enumerate(random_prompts(n, length, vocab, seed=seed)):
            engine.add_request(f"b{tag}{i}", p, params)

    wave("w", 20)  # warm-up: the same shapes
    _drain(engine)
    wave("t", 21)
    wall = _timed(engine, 6)
    _drain(engine)
    wave("p", 22)
    row = _profile(engine, 6, "burst", out_dir, wall)
    _drain(engine)
    return row


def mixed_and_decode(engine: LLMEngine, out_dir: Path, vocab: int) -> dict:
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for i, p in enumerate(random_prompts(64, 256, vocab, seed=1)):
        engine.add_request(f"d{i}", p, params)
    for _ in range(12):  # prefills done, decode graphs captured
        engine.step()
    rows = {"decode": _profile(engine, 10, "decode", out_dir, _timed(engine, 20))}
    extra = iter(random_prompts(40, 512, vocab, seed=2))

    def mixed_steps(n: int, tag: str) -> None:  # a new 512-token prompt joins every step
        for k in range(n):
            engine.add_request(f"m{tag}{k}", next(extra), one)
            engine.step()

    mixed_steps(5, "w")
    _sync()
    t0 = time.perf_counter()
    mixed_steps(10, "t")
    _sync()
    wall = 1e3 * (time.perf_counter() - t0) / 10
    with torch.profiler.profile(activities=ACT) as prof:
        mixed_steps(5, "p")
        _sync()
    kernel_ms = _kernel_ms(prof) / 5
    gpu = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30)
    cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    head = (f"mixed: step {wall:.2f} ms wall, {kernel_ms:.2f} ms of GPU kernels "
            f"(host share {1 - kernel_ms / wall:.0%})")  # fmt: skip
    print(head, flush=True)
    print(gpu[:5000], flush=True)
    print(cpu[:4000], flush=True)
    (out_dir / "profile_mixed_mixed.txt").write_text(f"{head}\n\n{gpu}\n\n{cpu}\n")
    rows["mixed"] = {"step_ms": wall, "kernel_ms": kernel_ms, "host_share": 1 - kernel_ms / wall}
    _drain(engine)
    return rows


def main() -> None:
    out_dir = Path(sys.argv[sys.argv.index("--out-dir") + 1] if "--out-dir" in sys.argv else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    import gpu_e2e

    flags = ["--smoke"] if SMOKE else []
    args = gpu_e2e.parse_args(["--no-save", "--skip-hf", "--vocab", "8192", *flags])
    hf = build_hf_model(args, torch.float32 if SMOKE else torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        del hf
        engine = _engine(tmp)
        rows = {"prefill": prefill(engine, out_dir, args.vocab)}
        rows.update(mixed_and_decode(engine, out_dir, args.vocab))
        del engine
        # the serving default: prefix caching on (policy "auto": "repeat" on CUDA)
        engine = _engine(tmp, prefix_caching=True)
        rows["prefill_prefix_caching"] = prefill(engine, out_dir, args.vocab, "prefill_pc")
        rows["burst"] = burst(engine, out_dir, args.vocab)
    command = " ".join(["python3"] + sys.argv)
    result = {"command": command, "commit": git_commit(), **environment(DEVICE), "rows": rows}
    (out_dir / "gpu_profile_mixed.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
