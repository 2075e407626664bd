"""Decode speed of the distributed path with one rank vs the plain engine, same run, same GPU.

Issue 19 item 8: with world size 1, the executor path (`distributed_executor_backend="mp"`,
`tensor_parallel_size=1`: the executor, a `StepPlan` built every step, the driver runner, CUDA
graphs as usual) must decode within 3% of the plain in-process engine. Both engines load the
same checkpoint (bench/gpu_e2e.py's ~1.5B Kimi-Linear-shaped model, bf16) and run the same
greedy batches, alternating (plain, executor, plain, executor) so drift hits both; the figure
is the ratio of the best step times. Greedy tokens must agree.

    PYTHONPATH=. python3 bench/gpu_tp_overhead.py              # H200, ~3 min
    PYTHONPATH=. python3 bench/gpu_tp_overhead.py --quick      # batches 1 and 64
    PYTHONPATH=. python3 bench/gpu_tp_overhead.py --smoke      # CPU, tiny model, a bug check
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

from gpu_e2e import (  # noqa: E402
    build_hf_model,
    random_prompts,
    run_and_record,
    run_engine,
)
from gpu_e2e import parse_args as e2e_args  # noqa: E402

from hyla.engine.llm_engine import LLMEngine  # noqa: E402


def make_engine(path: str, args: argparse.Namespace, backend: str) -> LLMEngine:
    return LLMEngine.from_path(
        path, device=args.device, dtype=args.dtype, max_num_seqs=max(args.batches),
        max_num_batched_tokens=args.chunk, max_model_len=args.prompt_len + args.decode_tokens + 16,
        enable_prefix_caching=False, kv_cache_memory=args.kv_cache_gib << 30,
        distributed_executor_backend=backend,
    )  # fmt: skip


def decode_row(engine: LLMEngine, args: argparse.Namespace, batch: int, tag: str) -> dict:
    prompts = random_prompts(batch, args.prompt_len, args.vocab, seed=batch)
    t = run_engine(engine, prompts, args.decode_tokens + 1, args.device, tag)
    return dict(step_ms=1e3 * t["decode_s"] / t["decode_steps"], tokens=t["tokens"])


def run(args: argparse.Namespace) -> dict:
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        build_hf_model(args, dtype).save_pretrained(tmp, safe_serialization=True)
        engines = {"plain": make_engine(tmp, args, "uni"), "executor": make_engine(tmp, args, "mp")}
        rows = []
        for b in args.batches:
            best: dict[str, float] = {}
            tokens: dict[str, list] = {}
            for name, engine in engines.items():  # warm: compiles, captures every bucket
                decode_row(engine, args, b, f"warm-{name}-{b}")
            for rep in range(args.repeats):
                for name, engine in engines.items():
                    r = decode_row(engine, args, b, f"{name}-{b}-{rep}")
                    best[name] = min(best.get(name, float("inf")), r["step_ms"])
                    tokens[name] = r["tokens"]
            ratio = best["plain"] / best["executor"]  # executor tok/s over plain tok/s
            row = dict(batch=b, plain_step_ms=best["plain"], executor_step_ms=best["executor"],
                       plain_tokens_per_s=1e3 * b / best["plain"],
                       executor_tokens_per_s=1e3 * b / best["executor"],
                       executor_over_plain=ratio,
                       greedy_equal=tokens["plain"] == tokens["executor"])  # fmt: skip
            rows.append(row)
            print(f"B={b:3d}: plain {row['plain_tokens_per_s']:9.1f} tok/s, executor "
                  f"{row['executor_tokens_per_s']:9.1f} tok/s, ratio {ratio:.4f}, greedy equal "
                  f"{row['greedy_equal']}")  # fmt: skip
        engines["executor"].shutdown()
    return dict(
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rows=rows,
        worst_ratio=min(r["executor_over_plain"] for r in rows),
        within_3_percent=all(r["executor_over_plain"] >= 0.97 for r in rows),
    )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    p.add_argument("--repeats", type=int, default=3)
    own, rest = p.parse_known_args()
    if not any(a == "--out" or a.startswith("--out=") for a in rest):
        rest += ["--out", str(ROOT / "bench" / "results" / "tp_overhead_h200.json")]
    args = e2e_args(rest)
    args.repeats = own.repeats
    if args.smoke:  # fla's kernels need a GPU: let transformers take its PyTorch fallback
        sys.modules["fla"] = None  # type: ignore[assignment]
    run_and_record("bench/gpu_tp_overhead.py", args, run)


if __name__ == "__main__":
    main()
