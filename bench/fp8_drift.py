"""FP8 precision drift on the embedded trained model (CPU): fp8 weights, fp8 cache, both, and
the bf16 model, each against the fp32 reference on the same tokens (`hyla.models.drift`).

The prompt is held-out Python standard-library source (modules the tokenizer and model never
saw, `hyla.training.stdlib_data`), `--prompt-len` tokens; the fp32 reference then decodes
`--new` greedy tokens and every configuration is teacher-forced along that path (prefill, then
one decode step per token, so the decode read paths of the cache run). The checkpoint's weights
are bf16, so the fp32 reference computes exactly on the stored weights.

    python3 bench/fp8_drift.py                       # 4096 + 512 tokens, ~15 min on 2 cores
    python3 bench/fp8_drift.py --prompt-len 512 --new 64 --no-save   # smoke

Bounds (checked, printed, saved; exit status 1 past one): BOUNDS below, relative to the bf16
model's own drift from fp32 measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import git_commit, hardware  # noqa: E402

from hyla.engine.loading import DEFAULT_MODEL_DIR, load_tokenizer  # noqa: E402
from hyla.models.drift import drift, forced_logprobs, greedy_reference, next_tokens  # noqa: E402
from hyla.models.loader import load_model  # noqa: E402
from hyla.training.stdlib_data import iter_modules, read_source  # noqa: E402

# name -> load_model keyword arguments; "fp32" is the reference
CONFIGS = {
    "fp32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "fp8_weights": {"dtype": "float32", "quantization": "fp8"},
    "fp8_cache": {"dtype": "float32", "kv_cache_dtype": "fp8"},
    "fp8_both": {"dtype": "float32", "quantization": "fp8", "kv_cache_dtype": "fp8"},
}
# Enforced bounds, relative to the bf16 model's own drift from fp32 on the same tokens (the
# yardstick: every GPU deployment accepts bf16). "kl_vs_bf16": most mean KL as a multiple of
# bf16's; "top1_floor": least top-1 agreement; "top1_vs_bf16": least top-1 minus bf16's.
#   fp8 cache: no worse than bf16 compute (1x): a cache format must not be the precision limit.
#   fp8 weights (W8A8): 16x, the ratio of e4m3's rounding step to bf16's (2^-4 vs 2^-8): rounding
#   noise of that size stays below it, a systematic error (a wrong block scale) goes far past.
BOUNDS = {
    "fp8_cache": {"kl_vs_bf16": 1.0, "top1_vs_bf16": -0.005},
    "fp8_weights": {"kl_vs_bf16": 16.0, "top1_floor": 0.90},
    "fp8_both": {"kl_vs_bf16": 16.0, "top1_floor": 0.90},
}


def heldout_prompt(tokenizer, num_tokens: int) -> list[int]:
    """`num_tokens` ids of held-out stdlib modules, concatenated in name order."""
    ids: list[int] = []
    for _, path in iter_modules(split="heldout"):
        text = read_source(path)
        if text:
            ids += tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= num_tokens:
            return ids[:num_tokens]
    raise RuntimeError(f"held-out modules hold only {len(ids)} tokens")


def check(name: str, stats: dict, bf16: dict) -> list[str]:
    """Violations of BOUNDS[name] given the bf16 yardstick's stats (empty when within)."""
    bound, out = BOUNDS.get(name, {}), []
    if "kl_vs_bf16" in bound and stats["mean_kl"] > bound["kl_vs_bf16"] * bf16["mean_kl"]:
        out.append(f"{name}: mean KL {stats['mean_kl']:.3g} > {bound['kl_vs_bf16']} x bf16's "
                   f"{bf16['mean_kl']:.3g}")  # fmt: skip
    floor = bound.get("top1_floor", -1.0)
    if "top1_vs_bf16" in bound:
        floor = bf16["top1_agreement"] + bound["top1_vs_bf16"]
    if stats["top1_agreement"] < floor:
        out.append(f"{name}: top-1 {stats['top1_agreement']:.4f} < {floor:.4f}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-len", type=int, default=4096)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--out", default=str(ROOT / "bench/results/fp8_drift_cpu.json"))
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    tokenizer = load_tokenizer(DEFAULT_MODEL_DIR)
    prompt = heldout_prompt(tokenizer, args.prompt_len)
    start = time.perf_counter()
    ref, tokens = greedy_reference(load_model(DEFAULT_MODEL_DIR, "float32", progress=False),
                                   prompt, args.new)  # fmt: skip
    targets = next_tokens(prompt, tokens)
    results, violations = {}, []
    print(f"reference fp32: {time.perf_counter() - start:.0f} s")
    for name, kwargs in CONFIGS.items():
        if name == "fp32":
            continue
        t0 = time.perf_counter()
        model = load_model(DEFAULT_MODEL_DIR, progress=False, **kwargs)
        other = forced_logprobs(model, prompt, tokens)
        stats = drift(ref, other, targets).to_dict()
        for part, rows in (("prompt", slice(0, len(prompt))), ("decode", slice(len(prompt), None))):
            stats[part] = drift(ref[rows], other[rows], targets[rows]).to_dict()
        results[name] = stats
        print(f"{name:12s} mean KL {stats['mean_kl']:.2e}  p99 {stats['p99_kl']:.2e}  "
              f"max {stats['max_kl']:.2e}  top-1 {stats['top1_agreement']:.4f}  "
              f"max |dlogp| {stats['max_logprob_diff']:.3f}  "
              f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    yardstick = results["bf16"]["mean_kl"]
    for name in BOUNDS:
        violations += check(name, results[name], results["bf16"])
        print(f"{name:12s} mean KL / bf16's = {results[name]['mean_kl'] / yardstick:.2f}x")
    record = {
        "command": " ".join(sys.argv),
        "commit": git_commit(),
        "hardware": hardware(),
        "model": "embedded default model (hyla/assets/default_model, bf16 weights)",
        "prompt": f"{len(prompt)} tokens of held-out stdlib source, then {len(tokens)} greedy",
        "reference": "fp32 compute, fp32 cache",
        "results": results,
        "bounds": BOUNDS,
        "violations": violations,
        "seconds": round(time.perf_counter() - start, 1),
    }
    if not args.no_save:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"saved {args.out}")
    for v in violations:
        print("BOUND EXCEEDED:", v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
