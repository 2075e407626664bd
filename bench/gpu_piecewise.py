"""Mixed prefill + decode steps with piecewise CUDA graphs (`piecewise_cuda_graphs=True`: norms
and MLP/MoE replayed per token bucket, mixers eager) against the same steps run eagerly, on the
bench/gpu_e2e.py model (~1.5B Kimi-Linear shape, vocab 8192), in the same run.

Per workload (decoding sequences + one round of short prompts prefilled beside them, each round
repeated): mean time per step that ran a prefill, with the graphs off (the baseline: decode
steps still captured) and on; ratio = off / on; the first tokens of the prompts compared.

    PYTHONPATH=. python3 bench/gpu_piecewise.py         # H200 (writes gpu_piecewise_h200.json)
    PYTHONPATH=. python3 bench/gpu_piecewise.py --smoke # CPU, tiny model: a bug check (no graphs)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

import gpu_e2e  # noqa: E402
import gpu_mixed_step  # noqa: E402

from hyla.engine.llm_engine import LLMEngine  # noqa: E402

# (decoding sequences, prompts per round, prompt length): small steps are launch-bound
WORKLOADS = ((16, 1, 64), (64, 1, 128), (64, 4, 256))


def build_engine(args: argparse.Namespace, path: str, piecewise: bool) -> LLMEngine:
    return LLMEngine.from_path(
        path, device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.context + 512, enable_prefix_caching=False,
        kv_cache_memory=args.kv_cache_gib << 30, piecewise_cuda_graphs=piecewise,
    )  # fmt: skip


def measure(args: argparse.Namespace, path: str, piecewise: bool) -> dict:
    engine = build_engine(args, path, piecewise)
    rows = {}
    for decodes, prefills, length in WORKLOADS:
        args.decodes, args.prefills, args.prefill_len = decodes, prefills, length
        gpu_mixed_step.start_decoders(engine, args)
        tag = f"{decodes}-{prefills}x{length}"
        gpu_mixed_step.mixed_steps(engine, args, f"warm-{tag}", 2)
        rows[tag] = gpu_mixed_step.mixed_steps(engine, args, tag, args.rounds)
        engine.abort_request([f"dec-{i}" for i in range(decodes)])
        engine.step()
    pieces = engine.runner.piecewise
    rows["replayed_steps"] = 0 if pieces is None else pieces.num_replayed_steps
    del engine
    return rows


def run(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    dtype = getattr(torch, args.dtype)
    hf = gpu_e2e.build_hf_model(args, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        del hf
        off = measure(args, tmp, False)
        on = measure(args, tmp, True)
    results = {"replayed_steps": on.pop("replayed_steps")}
    off.pop("replayed_steps")
    for tag in off:
        same = sum(a == b for a, b in zip(off[tag]["firsts"], on[tag]["firsts"], strict=True))
        results[tag] = {
            "eager_step_ms": off[tag]["step_ms"], "piecewise_step_ms": on[tag]["step_ms"],
            "ratio_eager_over_piecewise": off[tag]["step_ms"] / on[tag]["step_ms"],
            "same_first_tokens": f"{same}/{len(off[tag]['firsts'])}",
        }  # fmt: skip
        print(tag, results[tag], flush=True)
    if not args.no_save:
        gpu_e2e.write_result(Path(args.out), args.out_dir, {
            "command": " ".join(["python3", "bench/gpu_piecewise.py", *sys.argv[1:]]),
            "commit": gpu_e2e.git_commit(), **gpu_e2e.environment(args.device),
            "workloads": WORKLOADS, "results": results, "wall_s": time.perf_counter() - start,
        })  # fmt: skip
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, fp32: a bug check")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--decode-context", type=int, default=256, help="decoders' prompt length")
    p.add_argument("--context", type=int, default=1024, help="decoders' max_tokens")
    p.add_argument("--out", default=str(ROOT / "results" / "gpu_piecewise_h200.json"))
    p.add_argument("--out-dir", default=None, help="also copy the JSON here (e.g. $OUT)")
    p.add_argument("--no-save", action="store_true")
    own, rest = p.parse_known_args(argv)
    model = gpu_e2e.parse_args(["--vocab", "8192", *rest, *(["--smoke"] if own.smoke else [])])
    for key, value in vars(own).items():
        setattr(model, key, value)
    model.no_save = own.no_save or own.smoke
    if own.smoke:
        global WORKLOADS
        WORKLOADS = ((3, 1, 8),)
        model.rounds, model.decode_context, model.context = 2, 8, 64
    return model


def main() -> None:
    args = parse_args()
    if args.smoke:  # fla's kernels need a GPU: let transformers take its PyTorch fallback
        sys.modules["fla"] = None  # type: ignore[assignment]
    run(args)


if __name__ == "__main__":
    main()
