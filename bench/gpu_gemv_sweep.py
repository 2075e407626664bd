"""Tile sweep of the decode GEMV kernels against cuBLAS, on the shapes of bench/gpu_e2e.py's model
(a tuning aid: its picks become `pick_tiles` / `pick_blocks`; not a goal of its own).

Each case is timed from a CUDA graph of `--reps` calls, each on its own copy of the weights
(together > 2x the H200's 50 MB L2, so every call streams its weight from HBM as in a decode
step), as the median of 5 replays: microseconds per call and the fraction of the measured copy
bandwidth the weight bytes took. In the same run: F.linear (cuBLAS) on the same copies for the
dense GEMV; for the MoE GEMV the PyTorch form (`kernels._gathered` + `_weighted_sum`); for the
dense form's combine, `_select` + `_weighted_sum`.

    PYTHONPATH=. python3 bench/gpu_gemv_sweep.py --out-dir "$OUT"
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import git_commit  # noqa: E402 (bench/throughput.py: reads .git without git)

from hyla.ops.linear import gemv as dense_gemv  # noqa: E402
from hyla.ops.moe import gemv as moe_gemv  # noqa: E402
from hyla.ops.moe import kernels as moe_kernels  # noqa: E402

L2_BYTES = 50 << 20
DEFAULT_PARTS = "combine,moe,dense1"  # also: dense2, dense4
DENSE_SHAPES = [  # (N, D) of the e2e model's projections (after stacking)
    (6144, 2048), (2048, 2048), (3072, 2048), (1024, 2048), (2048, 512), (576, 2048),
    (272, 2048), (2048, 128), (32000, 2048), (12288, 2048), (2048, 6144),
]  # fmt: skip
MOE_SHAPES = [  # (T, E, k, I, D); E = 64 stands for DeepSeek's / Kimi's 256 (memory)
    (1, 32, 4, 512, 2048), (8, 32, 4, 512, 2048), (1, 64, 8, 2048, 7168),
    (4, 64, 8, 2048, 7168), (1, 64, 8, 1024, 2304),
]  # fmt: skip


def copies_for(nbytes: int) -> int:
    return max(2, min(64, (4 * L2_BYTES) // max(nbytes, 1) + 1))


def graph_us(calls, reps: int) -> float:
    """Median microseconds per call of `calls[i % len(calls)]()` x reps, replayed from a graph."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            calls[i % len(calls)]()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(times)


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * 10 / (time.perf_counter() - t0)


def dense_tiles(d: int):
    """The one-row GEMV's tile grid (depth clamped to D, duplicates dropped)."""
    seen = set()
    for cols, depth, warps in itertools.product((1, 2, 4, 8), (512, 1024, 2048), (4, 8)):
        tiles = dense_gemv.GemvTiles(cols, min(depth, triton_pow2(d)), warps)
        if tiles not in seen:
            seen.add(tiles)
            yield tiles


def sweep_linear(name: str, op, tile_grid, rows: int, bw: float, reps: int) -> list[dict]:
    """`op(x, w, tiles)` over `tile_grid(d)` vs F.linear at `rows` rows on every DENSE_SHAPES
    weight (rotated copies, see the module docstring): the best tiles per shape."""
    out = []
    for n, d in DENSE_SHAPES:
        nbytes = n * d * 2
        copies = copies_for(nbytes)
        ws = [torch.randn(n, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
        want = F.linear(x.float(), ws[0].float())
        base = graph_us([lambda w=w, x=x: F.linear(x, w) for w in ws], reps)
        best = None
        for tiles in tile_grid(d):
            try:
                got = op(x, ws[0], tiles).float()
                err = float((got - want).abs().max() / want.abs().max())
                us = graph_us([lambda w=w, x=x, t=tiles: op(x, w, t) for w in ws], reps)
            except Exception as e:  # noqa: BLE001 (a tile too large for registers / shared memory)
                print(f"  skip {tiles}: {type(e).__name__}", flush=True)
                continue
            if best is None or us < best["us"]:
                best = dict(tiles=list(dataclasses.astuple(tiles)), us=us, rel_err=err)
        row = dict(rows=rows, n=n, d=d, cublas_us=base, cublas_bw=nbytes / base / 1e-6 / bw,
                   best=best, best_bw=nbytes / best["us"] / 1e-6 / bw,
                   speedup=base / best["us"])  # fmt: skip
        print(f"{name} M={rows} N={n} D={d}: cublas {base:.2f} us ({row['cublas_bw']:.0%}) "
              f"triton {best['us']:.2f} us ({row['best_bw']:.0%}) {best['tiles']} "
              f"x{row['speedup']:.2f} err {best['rel_err']:.1e}", flush=True)  # fmt: skip
        out.append(row)
        del ws
    return out


def triton_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def moe_case(t: int, e: int, k: int, i: int, d: int):
    gen = torch.Generator(device="cuda").manual_seed(t * 131 + e)
    per = (e * 3 * i * d) * 2
    copies = max(2, min(16, (4 * L2_BYTES * e) // (per * k * t) + 1))  # bytes hit per call
    weights = []
    for _ in range(copies):
        gu = torch.randn(e, 2 * i, d, device="cuda", dtype=torch.bfloat16, generator=gen) / d**0.5
        dn = torch.randn(e, d, i, device="cuda", dtype=torch.bfloat16, generator=gen) / i**0.5
        weights.append((gu, dn))
    x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    ids = torch.stack([torch.randperm(e, device="cuda", generator=gen)[:k] for _ in range(t)])
    w = torch.rand(t, k, device="cuda", generator=gen)
    return x, weights, ids, w


def sweep_moe(bw: float, reps: int) -> list[dict]:
    out = []
    for t, e, k, i, d in MOE_SHAPES:
        x, weights, ids, w = moe_case(t, e, k, i, d)
        hit = len(set(ids.flatten().tolist()))
        nbytes = hit * 3 * i * d * 2
        gu0, dn0 = weights[0]
        want = torch_moe(x, gu0, dn0, w, ids).float()
        torch_us = graph_us(
            [lambda p=p, a=(x, w, ids): torch_moe(a[0], *p, *a[1:]) for p in weights], reps
        )
        old = moe_gemv.GemvBlocks()
        res = []
        gate_opts = itertools.product((2, 4, 8, 16), (1024, 2048), (4, 8))
        for gr, gc, gw in gate_opts:  # gate/up tiles with the default down tiles
            b = moe_gemv.GemvBlocks(gr, gc, gw, old.down_rows, old.down_cols, old.down_warps)
            res.append(run_moe(x, weights, ids, w, b, want, reps))
        best_gate = min((r for r in res if r), key=lambda r: r["us"])
        g = best_gate["blocks"]
        res2 = []
        for dr, dc, dw in itertools.product((4, 8, 16, 32), (128, 256, 512), (4, 8)):
            if triton_pow2(k) * dr * min(dc, triton_pow2(i)) > 32768:  # registers
                continue
            b = moe_gemv.GemvBlocks(g[0], g[1], g[2], dr, dc, dw)
            res2.append(run_moe(x, weights, ids, w, b, want, reps))
        best = min((r for r in res2 if r), key=lambda r: r["us"])
        default = run_moe(x, weights, ids, w, moe_gemv.pick_blocks(t, i, d), want, reps)
        row = dict(t=t, e=e, k=k, i=i, d=d, experts_hit=hit, torch_us=torch_us, default=default,
                   best=best, best_bw=nbytes / best["us"] / 1e-6 / bw,
                   default_bw=nbytes / default["us"] / 1e-6 / bw)  # fmt: skip
        print(f"moe T={t} E={e} k={k} I={i} D={d}: torch {torch_us:.2f} us, default "
              f"{default['us']:.2f} ({row['default_bw']:.0%}), best {best['us']:.2f} us "
              f"({row['best_bw']:.0%}) {best['blocks']} err {best['rel_err']:.1e}",
              flush=True)  # fmt: skip
        out.append(row)
        del weights
    return out


def torch_moe(x, gate_up, down, w, ids):
    return moe_kernels._weighted_sum(moe_kernels._gathered(x, gate_up, down, ids), w, ids, x.dtype)


def run_moe(x, weights, ids, w, blocks, want, reps) -> dict | None:
    try:
        got = moe_gemv.moe_gemv(x, *weights[0], w, ids, blocks).float()
        err = float((got - want).abs().max() / want.abs().max())
        calls = [lambda p=p: moe_gemv.moe_gemv(x, p[0], p[1], w, ids, blocks) for p in weights]
        us = graph_us(calls, reps)
    except Exception as e:  # noqa: BLE001
        print(f"  skip {blocks}: {type(e).__name__}", flush=True)
        return None
    b = blocks
    tiles = [b.gate_rows, b.gate_cols, b.gate_warps, b.down_rows, b.down_cols, b.down_warps]
    return dict(blocks=tiles, us=us, rel_err=err)


def torch_combine(y, w, ids, dtype):
    return moe_kernels._weighted_sum(moe_kernels._select(y, ids), w, ids, dtype)


def sweep_combine(reps: int) -> list[dict]:
    out = []
    for t, e, k, d in [(16, 32, 4, 2048), (64, 32, 4, 2048), (64, 256, 8, 7168)]:
        y = torch.randn(e, t, d, device="cuda", dtype=torch.bfloat16)
        ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)])
        w = torch.rand(t, k, device="cuda")
        want = moe_kernels._weighted_sum(moe_kernels._select(y, ids), w, ids, y.dtype)
        got = moe_gemv.combine(y, w, ids, y.dtype)
        args = (y, w, ids, y.dtype)
        torch_us = graph_us([lambda a=args: torch_combine(*a)], reps)
        us = graph_us([lambda a=args: moe_gemv.combine(*a)], reps)
        equal = bool(torch.equal(got, want))
        row = dict(t=t, e=e, k=k, d=d, torch_us=torch_us, triton_us=us, equal=equal)
        print(f"combine T={t} E={e} k={k} D={d}: torch {torch_us:.2f} us, triton {us:.2f} us, "
              f"bitwise equal {row['equal']}", flush=True)  # fmt: skip
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=64)
    p.add_argument("--parts", default=DEFAULT_PARTS)
    p.add_argument("--out-dir", default=".")
    args = p.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    parts = args.parts.split(",")
    res: dict = dict(
        command=" ".join(["PYTHONPATH=. python3 bench/gpu_gemv_sweep.py", *sys.argv[1:]]),
        commit=git_commit() or "unknown", torch=torch.__version__, copy_bandwidth=bw,
        gpu=torch.cuda.get_device_name(),
    )  # fmt: skip
    if "combine" in parts:
        res["combine"] = sweep_combine(args.reps)
    if "moe" in parts:
        res["moe"] = sweep_moe(bw, args.reps)
    for rows in (1, 2, 4):
        if f"dense{rows}" in parts:
            res[f"dense_m{rows}"] = sweep_linear(
                "dense", dense_gemv.gemv, dense_tiles, rows, bw, args.reps
            )
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    name = "gemv_sweep" if args.parts == DEFAULT_PARTS else "gemv_sweep_" + "_".join(parts)
    (Path(args.out_dir) / f"{name}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
