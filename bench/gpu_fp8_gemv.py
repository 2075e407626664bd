"""fp8 decode products vs bf16, same run: the projections and experts of bench/gpu_e2e.py's
~1.5B model at M = 1, 16, 64 rows (issue 22: fp8 decode steps measured 3.96x bf16's time).

Per projection shape (N, K) and rows M: `hyla.ops.fp8.kernels.fp8_linear` (the GEMV up to 4
rows, the GEMM with x quantized in registers beyond), the bf16 Triton GEMV
(`hyla.ops.linear.gemv`, M = 1: what bf16 decode runs) and torch's bf16 F.linear (cuBLAS);
ratio = fp8 time / the faster bf16 time (goal at M = 1: <= 0.6, half the bytes). Per MoE batch
T: `moe_kernels.fp8_moe_experts` vs bf16 `hyla.ops.moe.moe_experts` (E = 32, k = 4, I = 512,
D = 2048). A small tile sweep of the fp8 kernels on the two largest shapes tells whether
`tiles.pick_linear` is near the best (bench/gpu_fp8_sweep.py searches wider).

Timing as bench/gpu_gemv_sweep.py: a CUDA graph of `--reps` calls, each on its own copy of the
weights (together > 4x the 50 MB L2, so every call streams its weight from HBM as in a decode
step), median of 5 replays; bandwidth = weight bytes / time over the measured copy bandwidth.

    PYTHONPATH=. python3 bench/gpu_fp8_gemv.py --out-dir "$OUT"      # H200, ~1 min
    PYTHONPATH=. python3 bench/gpu_fp8_gemv.py --smoke               # CPU interpreter, a bug check
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:  # before triton loads
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_e2e import environment, write_result  # noqa: E402
from gpu_gemv_sweep import copies_for, copy_bandwidth, graph_us  # noqa: E402
from throughput import git_commit  # noqa: E402

from hyla.ops.fp8 import FP8, kernels, moe_kernels, reference, tiles  # noqa: E402
from hyla.ops.linear import gemv as bf16_gemv  # noqa: E402
from hyla.ops.moe import moe_experts  # noqa: E402

BLOCK = (128, 128)
SHAPES = {  # name: (N, K) of the model's projections as decode runs them (stacked groups)
    "kda_inputs": (6416, 2048), "kda_f_b": (2048, 128), "kda_o": (2048, 2048),
    "mla_q": (3072, 2048), "mla_kv_a": (576, 2048), "shared_gate_up": (1024, 2048),
    "shared_down": (2048, 512), "dense_gate_up": (12288, 2048), "dense_down": (2048, 6144),
}  # fmt: skip
SWEPT = ("kda_inputs", "kda_o")
MOE = dict(E=32, k=4, I=512, D=2048)


def fp8_weight(n: int, k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e4m3 codes and block scales (as bench/gpu_fp8.py's random_fill)."""
    q = (torch.randn(n, k, device=device) * 100).clamp_(-448, 448).to(FP8)
    s = torch.full((math.ceil(n / BLOCK[0]), math.ceil(k / BLOCK[1])), 1 / 448 / 30, device=device)
    return q, s


def timed(calls, args) -> float:
    """Microseconds per call (CUDA graph); NaN in the smoke run (each call run once)."""
    if args.smoke:
        for c in calls:
            c()
        return float("nan")
    return graph_us(calls, args.reps)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def linear_rows(name: str, n: int, k: int, rows: int, args, bw: float) -> dict:
    dev, copies = args.device, 2 if args.smoke else copies_for(n * k * 2)
    w8 = [fp8_weight(n, k, dev) for _ in range(copies)]
    w16 = [reference.dequantize_weight_blockwise(q, s, BLOCK).to(torch.bfloat16) for q, s in w8]
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    want = reference.fp8_linear(x.float(), *w8[0], BLOCK)
    err = rel_err(kernels.fp8_linear(x, *w8[0], BLOCK), want)
    pick = tiles.pick_linear(rows, n, k, kernels.device_name(x.device))
    fp8_us = timed([lambda q=q, s=s: kernels.fp8_linear(x, q, s, BLOCK) for q, s in w8], args)
    torch_us = timed([lambda w=w: F.linear(x, w) for w in w16], args)
    row = dict(name=name, n=n, k=k, rows=rows, fp8_us=fp8_us, torch_bf16_us=torch_us,
               fp8_rel_err=err, path=tiles.config_to_json(pick)["kernel"])  # fmt: skip
    if rows <= bf16_gemv.MAX_ROWS:
        row["gemv_bf16_us"] = timed([lambda w=w: bf16_gemv.gemv(x, w) for w in w16], args)
    best_bf16 = min(row["torch_bf16_us"], row.get("gemv_bf16_us", math.inf))
    row["ratio_vs_bf16"] = fp8_us / best_bf16
    row["fp8_bw"] = n * k / fp8_us / 1e-6 / bw
    row["bf16_bw"] = 2 * n * k / best_bf16 / 1e-6 / bw
    if name in SWEPT and not args.smoke:
        row["sweep"] = sweep(x, w8, rows, args)
    print(f"{name:15s} M={rows:3d} N={n:5d} K={k:5d}: fp8 {fp8_us:7.2f} us "
          f"({row['fp8_bw']:4.0%} bw)  bf16 {best_bf16:7.2f} us ({row['bf16_bw']:4.0%})  "
          f"ratio {row['ratio_vs_bf16']:.2f}  err {err:.1e}", flush=True)  # fmt: skip
    return row


def sweep(x, w8, rows: int, args) -> list[dict]:
    """fp8 kernel times over a few tiles around the pick (GEMV: columns x warps; GEMM:
    BLOCK_N x stages); bench/gpu_fp8_sweep.py searches wider."""
    pick = tiles.pick_linear(rows, w8[0][0].shape[0], x.shape[1], kernels.device_name(x.device))
    if isinstance(pick, tiles.GemvConfig):
        grid = [dict(cols=c, warps=w) for c in (2, 4, 8) for w in (4, 8)]
    else:
        grid = [dict(block_n=b, stages=s) for b in (32, 64, 128) for s in (3, 4)]
    out = []
    for change in grid:
        config = dataclasses.replace(pick, **change)
        fn = [lambda q=q, s=s, c=config: kernels.fp8_linear(x, q, s, BLOCK, c) for q, s in w8]
        out.append(dict(**change, us=timed(fn, args)))
    return out


def moe_rows(tokens: int, args, bw: float, grouped: bool | None = None) -> dict:
    dev, (E, k, I, D) = args.device, MOE.values()
    nbytes = E * 3 * I * D
    copies = 2 if args.smoke else max(2, min(16, copies_for(nbytes * 2 * k // E)))
    gu = [fp8_weight(E * 2 * I, D, dev) for _ in range(copies)]
    dn = [fp8_weight(E * D, I, dev) for _ in range(copies)]
    w8 = [(a.view(E, 2 * I, D), s.view(E, -1, s.shape[1]), b.view(E, D, I),
           t.view(E, -1, t.shape[1])) for (a, s), (b, t) in zip(gu, dn, strict=True)]  # fmt: skip
    w16 = [(_deq(a, s, 2), _deq(b, t, 1)) for a, s, b, t in w8]
    x = torch.randn(tokens, D, device=dev, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(tokens)]).to(dev)
    wts = torch.rand(tokens, k, device=dev)
    want = reference.fp8_moe_experts(x, *w8[0], wts, ids, BLOCK)
    got = moe_kernels.fp8_moe_experts(x, *w8[0], wts, ids, BLOCK, grouped=grouped)
    fp8 = [lambda w=w: moe_kernels.fp8_moe_experts(x, *w, wts, ids, BLOCK, grouped=grouped)
           for w in w8]  # fmt: skip
    fp8_us = timed(fp8, args)
    bf16_us = timed([lambda g=g, d=d: moe_experts(x, g, d, wts, ids) for g, d in w16], args)
    hit = int(ids.unique().numel())
    form = "auto" if grouped is None else ("grouped" if grouped else "gemv")
    row = dict(name="moe_experts", tokens=tokens, form=form, experts_hit=hit, fp8_us=fp8_us,
               bf16_us=bf16_us, ratio_vs_bf16=fp8_us / bf16_us, fp8_rel_err=rel_err(got, want),
               fp8_bw=hit * nbytes / E / fp8_us / 1e-6 / bw,
               bf16_bw=2 * hit * nbytes / E / bf16_us / 1e-6 / bw)  # fmt: skip
    print(f"moe T={tokens:3d} ({form:7s}, {hit} experts): fp8 {fp8_us:7.2f} us "
          f"({row['fp8_bw']:4.0%})  bf16 {bf16_us:7.2f} us ({row['bf16_bw']:4.0%})  "
          f"ratio {row['ratio_vs_bf16']:.2f}  err {row['fp8_rel_err']:.1e}",
          flush=True)  # fmt: skip
    return row


def _deq(q: torch.Tensor, s: torch.Tensor, parts: int) -> torch.Tensor:
    deq = [reference.dequantize_stacked(a, b, BLOCK, parts) for a, b in zip(q, s, strict=True)]
    return torch.stack(deq).to(torch.bfloat16)


def run(args) -> dict:
    bw = 1.0 if args.smoke else copy_bandwidth()
    rows = [1] if args.smoke else [int(r) for r in args.rows.split(",")]
    shapes = {"kda_o": (64, 256)} if args.smoke else SHAPES
    linear = [linear_rows(name, n, k, m, args, bw) for m in rows for name, (n, k) in shapes.items()]
    tokens = [1, 16] if args.smoke else [int(t) for t in args.tokens.split(",")]
    if args.smoke:
        MOE.update(E=8, I=128, D=256)
    moe = [moe_rows(t, args, bw) for t in tokens]
    moe += [moe_rows(t, args, bw, grouped=False) for t in tokens if t * MOE["k"] > MOE["E"]]
    return dict(copy_bandwidth_TBps=bw / 1e12, linear=linear, moe=moe)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,16,64")
    p.add_argument("--tokens", default="1,16,64")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_fp8_gemv_h200.json"))
    p.add_argument("--out-dir", default=None)
    args = p.parse_args()
    args.device = "cpu" if args.smoke else "cuda"
    result = dict(command=" ".join(["python3", "bench/gpu_fp8_gemv.py", *sys.argv[1:]]),
                  commit=git_commit(), **environment(args.device), workload=vars(args),
                  results=run(args))  # fmt: skip
    if not args.smoke:
        write_result(Path(args.out), args.out_dir, result)


if __name__ == "__main__":
    main()
