"""Speculative decoding (n-gram prompt lookup, `hyla.spec`) on one GPU: drafts on vs off, same
engine, same run.

Models: `e2e`, the ~1.5B Kimi-Linear-shaped model of bench/gpu_e2e.py (random bf16 weights,
vocab 8192) saved with the embedded model's tokenizer (as bench/gpu_serve.py does); `default`,
the embedded trained model (hyla/assets/default_model, trained on Python's standard library),
whose continuations copy code the way a trained checkpoint's do. A random model's drafts are
rarely accepted: its rows measure what drafting costs, the trained model's what it buys.

Workload ("repeat this code"): a standard-library function's source, a comment asking for it
unchanged, and its first line, through the real tokenizer (prompts cut to --prompt-tokens);
greedy, --output-tokens new tokens, EOS ignored. Per model and concurrency c (closed loop, c in
flight, max(c, --min-requests) requests):

    off      the engine with its spec decoder set aside (plain overlapped decoding)
    on       drafts on, the off-switch at its default (`disable_by_batch_size`, 8)
    forced   drafts on at every batch size (the switch at 64): what the switch avoids

    TPOT = (last token time - first token time) / (tokens - 1), mean over requests
    throughput = output tokens / wall seconds;  ratios on/off and forced/off in the same run

    PYTHONPATH=. python3 bench/gpu_spec_decode.py --out-dir $OUT     # H200, ~4 min
    PYTHONPATH=. python3 bench/gpu_spec_decode.py --device cpu        # tiny, a smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

import gpu_e2e  # noqa: E402
import gpu_serve  # noqa: E402

from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.engine.loading import DEFAULT_MODEL_DIR  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402

SOURCE_MODULES = ("textwrap", "json.encoder", "string", "shlex", "fnmatch", "calendar", "csv")


def code_prompts(tokenizer, num: int, max_tokens: int) -> list[list[int]]:
    """ "Repeat this code" prompts from standard-library functions (deterministic order)."""
    sources = []
    for name in SOURCE_MODULES:
        module = importlib.import_module(name)
        for _, fn in sorted(inspect.getmembers(module, inspect.isfunction)):
            if fn.__module__ == name:
                text = inspect.getsource(fn)
                if 400 <= len(text) <= 4000:
                    sources.append(text)
    prompts = []
    for i in range(num):
        src = sources[i % len(sources)]
        text = f"{src}\n\n# The same function again, unchanged:\n{src.splitlines()[0]}\n"
        ids = tokenizer.encode(text)
        prompts.append(ids[-max_tokens:])
    return prompts


def run_closed_loop(engine: LLMEngine, prompts: list[list[int]], c: int, n_out: int, tag: str):
    """Keep `c` requests in flight until all `prompts` finished; per-request times."""
    params = SamplingParams(temperature=0, max_tokens=n_out, ignore_eos=True)
    queue = list(enumerate(prompts))
    final = {}
    gpu_e2e.sync(str(engine.device))
    t0 = time.perf_counter()
    while queue or engine.has_unfinished_requests():
        while queue and engine.get_num_unfinished_requests() < c:
            i, p = queue.pop(0)
            engine.add_request(f"{tag}-{i}", p, params)
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    gpu_e2e.sync(str(engine.device))
    wall = time.perf_counter() - t0
    tpots, ttfts, tokens = [], [], []
    for i in range(len(prompts)):
        out = final[f"{tag}-{i}"]
        m, ids = out.metrics, out.outputs[0].token_ids
        tokens.append(ids)
        ttfts.append(m.first_token_time - m.arrival_time)
        if len(ids) > 1:
            tpots.append((m.last_token_time - m.first_token_time) / (len(ids) - 1))
    return dict(
        wall_s=wall,
        output_tokens=sum(map(len, tokens)),
        tokens_per_s=sum(map(len, tokens)) / wall,
        tpot_ms=1e3 * sum(tpots) / len(tpots),
        ttft_ms=1e3 * sum(ttfts) / len(ttfts),
        tokens=tokens,
    )


def spec_counts(engine: LLMEngine) -> tuple[int, int, int]:
    s = engine.get_stats()
    return (
        s.spec_decode_num_drafts,
        s.spec_decode_num_draft_tokens,
        s.spec_decode_num_accepted_tokens,
    )


def run_mode(engine: LLMEngine, mode: str, prompts, c: int, args) -> dict:
    """One (mode, c) row: warm-up pass of the same shape, then the timed one."""
    spec, config = engine.spec, engine.spec.config
    if mode == "off":
        engine.spec = None
    limit = args.max_concurrency if mode == "forced" else config.disable_by_batch_size
    spec.config = dataclasses.replace(config, disable_by_batch_size=limit)
    try:
        run_closed_loop(engine, prompts[:c], c, args.output_tokens, f"warm-{mode}-{c}")
        before = spec_counts(engine) if engine.spec else (0, 0, 0)
        row = run_closed_loop(engine, prompts, c, args.output_tokens, f"{mode}-{c}")
        after = spec_counts(engine) if engine.spec else (0, 0, 0)
    finally:
        engine.spec, spec.config = spec, config
    drafts, drafted, accepted = (a - b for a, b in zip(after, before, strict=True))
    row.update(
        mode=mode,
        concurrency=c,
        num_requests=len(prompts),
        num_drafts=drafts,
        num_draft_tokens=drafted,
        num_accepted_tokens=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
    )
    print(
        f"{mode:6s} c={c:3d}: {row['tokens_per_s']:9.1f} tok/s  TPOT {row['tpot_ms']:7.2f} ms"
        f"  accepted {accepted}/{drafted}"
    )
    return row


def model_dir(name: str, args, tmp: Path) -> Path:
    if name == "default":
        return DEFAULT_MODEL_DIR
    e2e = gpu_e2e.parse_args(
        ["--vocab", "8192", "--device", args.device, "--dtype", args.dtype]
        + (["--smoke", "--no-save"] if args.device == "cpu" else [])
    )
    e2e.vocab, e2e.prompt_len = 8192, args.prompt_tokens + args.output_tokens + 64
    path = tmp / "e2e"
    path.mkdir()
    gpu_serve.build_checkpoint(e2e, path)
    return path


def bench_model(name: str, args, tmp: Path) -> dict:
    path = model_dir(name, args, tmp)
    spec = {
        "method": "ngram",
        "num_speculative_tokens": args.k,
        "prompt_lookup_min": args.lookup_min,
        "prompt_lookup_max": args.lookup_max,
        "disable_by_batch_size": args.max_concurrency,
    }
    engine = LLMEngine.from_path(
        str(path),
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.max_concurrency,
        max_num_batched_tokens=args.chunk,
        max_model_len=args.prompt_tokens + args.output_tokens + 64,
        kv_cache_memory=args.kv_cache_gib << 30,
        enable_prefix_caching=False,
        speculative_config=spec,
    )
    default_limit = type(engine.spec.config)().disable_by_batch_size
    engine.spec.config = dataclasses.replace(
        engine.spec.config, disable_by_batch_size=default_limit
    )
    rows = []
    for c in args.concurrency:
        prompts = code_prompts(engine.tokenizer, max(c, args.min_requests), args.prompt_tokens)
        by_mode = {m: run_mode(engine, m, prompts, c, args) for m in ("off", "on", "forced")}
        off = by_mode["off"]
        for m in ("on", "forced"):
            row = by_mode[m]
            row["tpot_speedup"] = off["tpot_ms"] / row["tpot_ms"]
            row["throughput_ratio"] = row["tokens_per_s"] / off["tokens_per_s"]
            same = sum(a == b for a, b in zip(row["tokens"], off["tokens"], strict=True))
            row["identical_outputs"] = f"{same}/{len(prompts)}"
        for row in by_mode.values():
            del row["tokens"]
            rows.append(row)
        on, forced = by_mode["on"], by_mode["forced"]
        print(
            f"{name} c={c}: on/off TPOT {on['tpot_speedup']:.2f}x, throughput "
            f"{on['throughput_ratio']:.2f}x; forced {forced['tpot_speedup']:.2f}x"
            f" / {forced['throughput_ratio']:.2f}x"
        )
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return dict(model=name, default_disable_by_batch_size=default_limit, rows=rows)


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return {name: bench_model(name, args, Path(tmp)) for name in args.models}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--models", default="e2e,default")
    p.add_argument("--concurrency", default="1,4,8,16,64")
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=768)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--lookup-min", type=int, default=2)
    p.add_argument("--lookup-max", type=int, default=4)
    p.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--kv-cache-gib", type=int, default=8)
    p.add_argument("--out", default=str(ROOT / "results" / "spec_decode_h200.json"))
    p.add_argument("--out-dir", default=None, help="also copy the JSON here (e.g. $OUT)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.device == "cpu":  # a smoke test: tiny e2e model, short prompts
        args.dtype = args.dtype or "float32"
        args.concurrency, args.min_requests = "1,4", 2
        args.prompt_tokens, args.output_tokens, args.chunk, args.kv_cache_gib = 96, 12, 512, 1
        if args.out.endswith("spec_decode_h200.json"):
            args.out = str(ROOT / "results" / "spec_decode_cpu_smoke.json")
    args.dtype = args.dtype or "bfloat16"
    args.models = args.models.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.max_concurrency = max(args.concurrency)
    args.prefill_lens = []
    return args


def main() -> None:
    args = parse_args()
    if args.device == "cpu":  # fla's kernels need a GPU: let transformers take its fallback
        sys.modules["fla"] = None  # type: ignore[assignment]
    gpu_e2e.run_and_record("bench/gpu_spec_decode.py", args, run)


if __name__ == "__main__":
    main()
