"""One MLA layer's attention on a prefill step, 1.5B Kimi-Linear shapes (bench/gpu_e2e.py: 16
heads, Dn = Dv = 128, Dr = 64, R = 512, 16-token pages, bf16): the absorbed split-k kernel that
every row took before (`mla_paged`) against the expanded form through the tiled GQA kernel
(`mla_prefill`), in the same run, for 1K / 4K / 8K new tokens after 0 and 8K cached tokens.

Per point: median ms of each (triton do_bench), the ratio old / new, the new path with its
192-wide keys as one dot padded to 256 instead of 128 + 64 (`gqa.kernels.SPLIT_KEYS`), its
attention TFLOP/s (causal QK^T and PV over Dn + Dr and Dv, plus the kv_b_proj expansion of the
context) and the max relative difference between the two outputs (the same attention).

`--step` measures instead a whole mixed step of the bench/gpu_e2e.py model (the workload and
flags of bench/gpu_mixed_step.py, default one 8,192-token prompt beside 56 decoders): MLA's
prefill rows through `mla_prefill` (new) and through `mla_paged` (old: as every row went
before), same engine, same run.

    PYTHONPATH=. python3 bench/gpu_mla_prefill.py                     # H200, ~1 min
    PYTHONPATH=. python3 bench/gpu_mla_prefill.py --kv-cache-dtype fp8
    PYTHONPATH=. python3 bench/gpu_mla_prefill.py --step              # H200, ~3 min
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/gpu_mla_prefill.py --smoke   # CPU bug check
    PYTHONPATH=. python3 bench/gpu_mla_prefill.py --step --smoke      # CPU bug check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

from hyla.ops.dsa_indexer.rows import row_positions  # noqa: E402
from hyla.ops.fp8.reference import quantize_per_token  # noqa: E402
from hyla.ops.mla.prefill import mla_prefill_flash  # noqa: E402

HEADS, DN, DR, DV, RANK, PAGE = 16, 128, 64, 128, 512, 16
NEW_TOKENS = (1024, 4096, 8192)
CACHED = (0, 8192)


def timed(fn) -> float:
    """Median ms (CUDA: triton do_bench; CPU smoke: one call)."""
    if not torch.cuda.is_available():
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    import triton

    return triton.testing.do_bench(fn, warmup=5, rep=100, return_mode="median")


def make_inputs(new: int, cached: int, device: str, fp8: bool, dtype: torch.dtype) -> dict:
    """One sequence of `cached + new` tokens in a shuffled paged latent cache; its new rows'
    queries; kv_b_proj's weight."""
    gen = torch.Generator(device=device).manual_seed(new + cached)
    total = cached + new
    pages = -(-total // PAGE)
    order = torch.randperm(pages + 1, generator=gen, device=device)
    cache = torch.randn(pages + 1, PAGE, RANK + DR, generator=gen, device=device)
    scale = None
    if fp8:
        cache, scale = quantize_per_token(cache)
    else:
        cache = cache.to(dtype)
    like = {"dtype": dtype, "device": device}
    kv_b = torch.randn(HEADS * (DN + DV), RANK, generator=gen, device=device) / RANK**0.5
    return {
        "q_nope": torch.randn(new, HEADS, DN, generator=gen, device=device).to(**like),
        "q_rope": torch.randn(new, HEADS, DR, generator=gen, device=device).to(**like),
        "cache": cache,
        "latent_scale": scale,
        "tables": order[:pages].to(torch.int32)[None],
        "cu": torch.tensor([0, new], dtype=torch.int32, device=device),
        "seq_lens": [total],
        "kv_b": kv_b.to(**like),
    }


def run_point(new: int, cached: int, device: str, fp8: bool, dtype: torch.dtype) -> dict:
    from hyla.ops.gqa import kernels as gqa_kernels
    from hyla.ops.mla.paged import mla_paged

    x = make_inputs(new, cached, device, fp8, dtype)
    scale = (DN + DR) ** -0.5
    lens = torch.tensor(x["seq_lens"], dtype=torch.int32, device=device)
    rows = row_positions(x["cu"], lens, new)
    common = (x["q_nope"], x["q_rope"], x["cache"], x["tables"], x["cu"])

    def old():
        return mla_paged(*common, lens, x["seq_lens"][0], x["kv_b"], scale, rows=rows,
                         latent_scale=x["latent_scale"])  # fmt: skip

    def new_path():
        return mla_prefill_flash(*common, x["seq_lens"], x["kv_b"], scale, query_lens=[new],
                                 latent_scale=x["latent_scale"])  # fmt: skip

    a, b = old().float(), new_path().float()
    diff = float((a - b).abs().max() / a.abs().max())
    old_ms, new_ms = timed(old), timed(new_path)
    gqa_kernels.SPLIT_KEYS = False  # Dn + Dr = 192 as one dot padded to 256
    padded_ms = timed(new_path)
    gqa_kernels.SPLIT_KEYS = True
    total = cached + new
    pairs = new * cached + new * (new + 1) / 2  # (query, key) pairs seen, causal
    flops = 2 * pairs * HEADS * (DN + DR + DV) + 2 * total * RANK * HEADS * (DN + DV)
    return {
        "new_tokens": new,
        "cached_tokens": cached,
        "mla_paged_ms": old_ms,
        "mla_prefill_ms": new_ms,
        "speedup": old_ms / new_ms,
        "mla_prefill_one_padded_dot_ms": padded_ms,
        "mla_prefill_tflops": flops / new_ms / 1e9,
        "max_rel_diff": diff,
    }


@contextlib.contextmanager
def prefill_through_paged() -> Iterator[None]:
    """MLA layers' prefill sequences through `mla_paged` (the absorbed split-k kernel), as
    before `mla_prefill`; their decode rows take it either way."""
    import hyla.layers.attention as attention
    from hyla.ops.mla.paged import mla_paged

    def through_paged(q_nope, q_rope, cache, tables, cu, seq_lens, weight, scale, *,
                      query_lens=None, latent_scale=None):  # fmt: skip
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=q_nope.device)
        return mla_paged(q_nope, q_rope, cache, tables, cu, lens, max(seq_lens), weight, scale,
                         latent_scale=latent_scale)  # fmt: skip

    saved = attention.mla_prefill
    attention.mla_prefill = through_paged
    try:
        yield
    finally:
        attention.mla_prefill = saved


def bench_step(rest: list[str], smoke: bool) -> dict:
    """Mean time of a step carrying the prompts' prefill, new vs old MLA prefill path."""
    import gpu_e2e
    import gpu_mixed_step as mixed

    args = mixed.parse_args(["--prefills", "1", "--prefill-len", "8192", *rest,
                             *(["--smoke"] if smoke else [])])  # fmt: skip
    if smoke:  # fla's kernels need a GPU: transformers takes its PyTorch fallback
        sys.modules["fla"] = None  # type: ignore[assignment]
    hf = gpu_e2e.build_hf_model(args, getattr(torch, args.dtype))
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        del hf
        engine = mixed.build_engine(args, tmp)
    mixed.start_decoders(engine, args)
    rows = {}
    for mode in ("new", "old"):
        with prefill_through_paged() if mode == "old" else contextlib.nullcontext():
            mixed.mixed_steps(engine, args, f"warm-{mode}", 2)  # compiles, autotunes
            rows[mode] = mixed.mixed_steps(engine, args, mode, args.rounds)
        print(f"step ({mode} MLA prefill): {rows[mode]['step_ms']:8.2f} ms per step "
              f"({args.prefills} x {args.prefill_len} + {args.decodes} decodes)")  # fmt: skip
    same = sum(a == b for a, b in zip(rows["new"]["firsts"], rows["old"]["firsts"], strict=True))
    result = {f"{m}_mla_prefill": {k: v for k, v in r.items() if k != "firsts"}
              for m, r in rows.items()}  # fmt: skip
    result["speedup"] = rows["old"]["step_ms"] / rows["new"]["step_ms"]
    result["same_first_tokens"] = f"{same}/{len(rows['new']['firsts'])}"
    keys = ("prefills", "prefill_len", "decodes", "decode_context", "rounds", "layers")
    result["workload"] = {k: getattr(args, k) for k in keys}
    print(f"step old / new: {result['speedup']:.2f}x; same first tokens "
          f"{result['same_first_tokens']}")  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny lengths (CPU interpreter)")
    parser.add_argument("--kv-cache-dtype", default="bfloat16", choices=["bfloat16", "fp8"])
    parser.add_argument("--step", action="store_true", help="a whole mixed step of the model")
    parser.add_argument("--out", default=None)
    args, rest = parser.parse_known_args()
    if args.step:
        return write("gpu_mla_prefill_step_h200", args, bench_step(rest, args.smoke))
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fp8 = args.kv_cache_dtype == "fp8"
    news, cacheds = ((64,), (0, 48)) if args.smoke else (NEW_TOKENS, CACHED)
    dtype = torch.float32 if args.smoke else torch.bfloat16  # the interpreter has no bf16 dot
    results = []
    for cached in cacheds:
        for new in news:
            res = run_point(new, cached, device, fp8, dtype)
            results.append(res)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in res.items()), flush=True)  # fmt: skip
    shapes = {"heads": HEADS, "dn": DN, "dr": DR, "dv": DV, "rank": RANK, "page": PAGE}
    name = "gpu_mla_prefill_h200" + ("_fp8" if fp8 else "")
    write(name, args, {"shapes": shapes, "kv_cache_dtype": args.kv_cache_dtype, "points": results})


def write(name: str, args: argparse.Namespace, results: dict) -> None:
    """bench/results/<name>.json (or --out) with the command, commit and hardware; a smoke run
    writes only with --out."""
    out = Path(args.out or ROOT / "results" / f"{name}.json")
    cuda = torch.cuda.is_available()
    record = {
        "command": " ".join(["python3", *sys.argv]),
        "commit": _commit(),
        "gpu": torch.cuda.get_device_name() if cuda else "cpu (smoke)",
        "torch": torch.__version__,
        "results": results,
    }
    if not args.smoke or args.out:
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}")


def _commit() -> str:
    try:
        from throughput import git_commit  # bench/throughput.py: reads .git without git

        return git_commit() or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


if __name__ == "__main__":
    main()
