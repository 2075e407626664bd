"""Tile sweep of the fp8 kernels against bf16, same run (issue 22: fp8 decode step <= 0.6x
bf16); its winners become the tuned table the picks of `hyla.ops.fp8.tiles` read.

Cases: every projection shape (N, K) of bench/gpu_fp8_gemv.py's ~1.5B model at M = 1, 4, 16,
64 rows, and its experts (E = 32, k = 4, I = 512, D = 2048) at T = 1, 4, 16, 64 tokens;
`--shapes big`: the ~30B model of bench/gpu_fp8.py --big (hidden 4096, 32 heads of 128, E = 64,
k = 6, I = 1408). Per case, in the same run: bf16 cuBLAS (F.linear) and, up to 4 rows, the bf16
Triton GEMV (`hyla.ops.linear.gemv`); for experts bf16 `hyla.ops.moe.moe_experts`.

Search: from the default pick, one field at a time over its options (the others held), the
best kept; `--rounds 2` goes over the fields again where the first round moved (coordinate
descent: ~20 configs per start instead of the ~10^4 of the full grid). Starts: the default
pick; from 4 to 16 rows also a multi-row GEMV; up to 4 rows also the GEMM (16-row tiles: its
loads are software-pipelined, the GEMV's are not). A config whose result
is off the reference by more than ERR_BOUND is refused. Rows outer (M = 1 first); the budget
(`--budget-s`) is shared out over the cases left (a case may take `--greed` shares), so the run
ends in time (Triton compiles each new config once, ~1 s; later shapes reuse them). The search
run with random timings on the 1.5B shapes visits ~660 configs in ~215 distinct compiles at
rows 1 and 4, ~320 in ~90 at rows 16 and 64: hence two runs.

Timing as bench/gpu_fp8_gemv.py: a CUDA graph of `--reps` calls, each on its own copy of the
weights (the fp8 copies > 2x the 50 MB L2 together: weights stream from HBM), median of 5
replays, microseconds per call including every launch of the config (split-K's sum, the
unfused GEMM's quantization).

    PYTHONPATH=. python3 bench/gpu_fp8_sweep.py --rows 1,4 --out-dir "$OUT" \\
        --write-table "$OUT/tuned_h200.json"                             # H200, <= 6 min
    PYTHONPATH=. python3 bench/gpu_fp8_sweep.py --rows 16,64 --name-suffix _m16_64 \\
        --out-dir "$OUT" --write-table "$OUT/tuned_h200_m16_64.json"     # H200, <= 6 min
    PYTHONPATH=. python3 bench/gpu_fp8_sweep.py --shapes big --rows 1 --out-dir "$OUT" \\
        --write-table "$OUT/tuned_h200_big.json"                         # the 30B shapes
    PYTHONPATH=. python3 bench/gpu_fp8_sweep.py --smoke                  # CPU interpreter

`--write-table` merges the winners that beat the default by `--min-gain` into that table file
(its other keys kept; a new file if none); copied into hyla/ops/fp8/, the picks read it on that
device (`tiles.load_tables`: files of one device merge). Elsewhere the defaults stay.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton loads
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_fp8_gemv as base  # noqa: E402
from gpu_e2e import environment, write_result  # noqa: E402
from gpu_gemv_sweep import copies_for, copy_bandwidth  # noqa: E402
from throughput import git_commit  # noqa: E402

from hyla.ops.fp8 import kernels, moe_kernels, reference, tiles  # noqa: E402
from hyla.ops.fp8.tiles import GemmConfig, GemvConfig, MoeTiles  # noqa: E402
from hyla.ops.linear import gemv as bf16_gemv  # noqa: E402
from hyla.ops.moe import moe_experts  # noqa: E402

ERR_BOUND = 2e-2  # bf16 output rounding plus fp8 tensor-core sums (tests/gpu/test_fp8_gpu.py)
BIG_SHAPES = {  # bench/gpu_fp8.py --big: hidden 4096, 32 heads x 128, I = 1408, dense 3 x hidden
    "kda_inputs": (12576, 4096), "kda_f_b": (4096, 128), "kda_o": (4096, 4096),
    "mla_q": (6144, 4096), "mla_kv_a": (576, 4096), "shared_gate_up": (2816, 4096),
    "shared_down": (4096, 1408), "dense_gate_up": (24576, 4096), "dense_down": (4096, 12288),
}  # fmt: skip
BIG_MOE = dict(E=64, k=6, I=1408, D=4096)
GEMV_TILES = (
    (2, 2048),
    (4, 2048),
    (8, 2048),
    (4, 1024),
    (8, 1024),
    (16, 1024),
    (4, 512),
    (8, 512),
    (16, 512),
    (32, 512),
    (16, 256),
    (32, 256),
)  # (cols, depth)
OPTIONS = {  # field (or fields moved together) -> options, in search order
    GemvConfig: {("cols", "depth"): GEMV_TILES, "prefetch": (False, True),
                 "split_k": (1, 2, 4, 8), "warps": (4, 8), "stages": (1, 3),
                 "rows": (1, 2, 4, 8, 16)},
    GemmConfig: {"block_n": (32, 64, 128), "split_k": (1, 2, 4, 8, 16), "block_m": (16, 32, 64),
                 "fused": (True, False), "stages": (2, 3, 4), "warps": (4, 8)},
    MoeTiles: {"gate_rows": (2, 4, 8), "depth": (512, 1024, 2048), "gate_warps": (4, 8),
               "down_cols": (2, 4, 8), "down_depth": (256, 512, 1024), "down_warps": (4, 8),
               "block_m": (16, 32, 64), "block_n": (32, 64, 128), "grouped_fused": (True, False),
               "grouped_warps": (4, 8), "grouped_stages": (2, 3, 4)},
}  # fmt: skip
SMOKE_OPTIONS = {
    GemvConfig: {
        ("cols", "depth"): ((4, 256), (8, 64)),
        "prefetch": (False, True),
        "split_k": (1, 2),
        "rows": (1, 4),
    },
    GemmConfig: {"block_n": (16, 32), "split_k": (1, 3), "fused": (True, False)},
    MoeTiles: {
        "gate_rows": (2, 4),
        "down_cols": (2, 4),
        "block_m": (16, 32),
        "grouped_fused": (True, False),
    },
}


def feasible(config, rows: int, k: int) -> bool:
    """Register-sized tiles only (a [rows, cols, depth] fp32 product per GEMV program; GEMM
    tiles up to 64 x 128), rows per program no more than the call's."""
    if isinstance(config, GemvConfig):
        depth = min(config.depth, 1 << (k - 1).bit_length())
        return config.rows <= rows and config.rows * config.cols * depth <= 16384
    if isinstance(config, GemmConfig):
        return config.block_m * config.block_n <= 8192 and config.block_m <= max(16, rows)
    return config.gate_rows * config.depth <= 16384


class Search:
    """Coordinate descent over one kind's OPTIONS from `start`; `measure(config)` -> us or None
    (refused); stops at `deadline` (time.monotonic)."""

    def __init__(self, measure, options: dict, deadline: float, ok, rounds: int) -> None:
        self.measure, self.options, self.deadline, self.ok = measure, options, deadline, ok
        self.rounds = rounds
        self.tried: dict = {}
        self.budget_hit = False

    def time(self, config, force: bool = False) -> float:
        if config not in self.tried:
            if time.monotonic() > self.deadline and not force:
                self.budget_hit = True
                return math.inf
            us = self.measure(config)
            self.tried[config] = math.inf if us is None else us
        return self.tried[config]

    def run(self, start) -> tuple[object, float]:
        best, best_us = start, self.time(start, force=True)  # the default is always timed
        for _ in range(self.rounds):
            moved = False
            for field, values in self.options.items():
                names = field if isinstance(field, tuple) else (field,)
                for value in values:
                    value = value if isinstance(field, tuple) else (value,)
                    cand = dataclasses.replace(best, **dict(zip(names, value, strict=True)))
                    if cand != best and self.ok(cand) and self.time(cand) < best_us:
                        best, best_us, moved = cand, self.tried[cand], True
            if not moved or _ == self.rounds - 1:
                break
        return best, best_us


def linear_case(name, n, k, rows, ws, args, deadline) -> dict:
    """Search the GEMV and/or GEMM configs of one (shape, rows) against bf16."""
    w8, w16 = ws
    x = torch.randn(rows, k, device=args.device, dtype=torch.bfloat16)
    want = reference.fp8_linear(x.float(), *w8[0], base.BLOCK)

    def measure(config):
        try:
            err = base.rel_err(kernels.fp8_linear(x, *w8[0], base.BLOCK, config), want)
        except Exception as e:  # noqa: BLE001 (a config the compiler refuses: out of resources)
            print(f"  refused {config}: {type(e).__name__}", flush=True)
            return None
        if not err <= ERR_BOUND:
            print(f"  refused {config}: rel err {err:.1e}", flush=True)
            return None
        calls = [lambda q=q, s=s: kernels.fp8_linear(x, q, s, base.BLOCK, config) for q, s in w8]
        return timed_or_none(calls, config, args)

    default = tiles.default_linear(rows, n, k)
    starts = [default]  # + the other kinds' starts (coordinate descent cannot walk between them)
    if 4 <= rows <= 16:  # multi-row GEMV programs, register-sized
        per_program = min(16, 1 << (rows - 1).bit_length())
        starts.append(GemvConfig(cols=4, depth=1024 if rows <= 4 else 256, rows=per_program))
    if rows <= tiles.GEMV_ROWS:  # tensor-core tiles of 16 rows, software-pipelined loads
        starts.append(GemmConfig(block_m=16, block_n=64, split_k=2))
    found = []
    for i, start in enumerate(starts):
        share = time.monotonic() + (deadline - time.monotonic()) / (len(starts) - i)  # per kind
        ok = lambda c: feasible(c, rows, k)  # noqa: E731
        search = Search(measure, args.options[type(start)], share, ok, args.rounds)
        found.append((*search.run(start), search))
    best, best_us, _ = min(found, key=lambda f: f[1])
    default_us = next(s.tried[default] for *_, s in found if default in s.tried)
    row = dict(name=name, n=n, k=k, rows=rows, **bf16_times(x, w16, args))
    row.update(default=tiles.config_to_json(default), default_us=default_us,
               best=tiles.config_to_json(best), best_us=best_us,
               tried=[dict(config=tiles.config_to_json(c), us=us)
                      for *_, s in found for c, us in s.tried.items()],
               budget_hit=any(s.budget_hit for *_, s in found))  # fmt: skip
    return finish(row, f"{name:15s} M={rows:3d} N={n:5d} K={k:5d}", n * k, args)


def timed_or_none(calls, config, args) -> float | None:
    try:
        return base.timed(calls, args)
    except Exception as e:  # noqa: BLE001 (a capture that fails: the config is refused)
        print(f"  refused {config}: {type(e).__name__} while timing", flush=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return None


def bf16_times(x, w16, args) -> dict:
    out = dict(torch_bf16_us=base.timed([lambda w=w: F.linear(x, w) for w in w16], args))
    if x.shape[0] <= bf16_gemv.MAX_ROWS:
        out["gemv_bf16_us"] = base.timed([lambda w=w: bf16_gemv.gemv(x, w) for w in w16], args)
    out["bf16_us"] = min(out.values())
    return out


def finish(row: dict, label: str, fp8_bytes: int, args) -> dict:
    bf16 = row["bf16_us"]
    row["ratio_default"], row["ratio_best"] = row["default_us"] / bf16, row["best_us"] / bf16
    row["best_bw"] = fp8_bytes / row["best_us"] / 1e-6 / args.bandwidth
    print(f"{label}: bf16 {bf16:7.2f} us  fp8 default {row['default_us']:7.2f} "
          f"(x{row['ratio_default']:.2f})  best {row['best_us']:7.2f} (x{row['ratio_best']:.2f}, "
          f"{row['best_bw']:4.0%} bw) {row['best']}{'  [budget]' if row['budget_hit'] else ''}",
          flush=True)  # fmt: skip
    return row


def is_grouped(field: str) -> bool:
    return field in ("block_m", "block_n") or field.startswith("grouped")


def linear_weights(n: int, k: int, args):
    copies = 2 if args.smoke else copies_for(n * k * 2)
    w8 = [base.fp8_weight(n, k, args.device) for _ in range(copies)]
    w16 = [reference.dequantize_weight_blockwise(q, s, base.BLOCK).to(torch.bfloat16)
           for q, s in w8]  # fmt: skip
    return w8, w16


def moe_case(tokens: int, moe: dict, args, deadline) -> dict:
    dev, (E, k, I, D) = args.device, moe.values()  # noqa: N806
    nbytes = E * 3 * I * D
    copies = 2 if args.smoke else max(2, min(16, copies_for(nbytes * 2 * k // E)))
    gu = [base.fp8_weight(E * 2 * I, D, dev) for _ in range(copies)]
    dn = [base.fp8_weight(E * D, I, dev) for _ in range(copies)]
    w8 = [(a.view(E, 2 * I, D), s.view(E, -1, s.shape[1]), b.view(E, D, I),
           t.view(E, -1, t.shape[1])) for (a, s), (b, t) in zip(gu, dn, strict=True)]  # fmt: skip
    w16 = [(base._deq(a, s, 2), base._deq(b, t, 1)) for a, s, b, t in w8]
    x = torch.randn(tokens, D, device=dev, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(tokens)]).to(dev)
    wts = torch.rand(tokens, k, device=dev)
    want = reference.fp8_moe_experts(x, *w8[0], wts, ids, base.BLOCK)
    run = lambda w, t: moe_kernels.fp8_moe_experts(x, *w, wts, ids, base.BLOCK, tiles=t)  # noqa: E731

    def measure(t):
        try:
            err = base.rel_err(run(w8[0], t), want)
        except Exception as e:  # noqa: BLE001
            print(f"  refused {t}: {type(e).__name__}", flush=True)
            return None
        if not err <= ERR_BOUND * 4:  # bf16 intermediates re-quantized (MOE_BF16_BOUND)
            print(f"  refused {t}: rel err {err:.1e}", flush=True)
            return None
        return timed_or_none([lambda w=w: run(w, t) for w in w8], t, args)

    form = "gemv" if moe_kernels.gemv_form(tokens, k, E) else "grouped"
    fields = {
        f: v for f, v in args.options[MoeTiles].items() if is_grouped(f) == (form == "grouped")
    }
    search = Search(measure, fields, deadline, lambda c: feasible(c, tokens, D), args.rounds)
    best, best_us = search.run(MoeTiles())
    hit = int(ids.unique().numel())
    bf16 = base.timed([lambda g=g, d=d: moe_experts(x, g, d, wts, ids) for g, d in w16], args)
    row = dict(name="moe_experts", tokens=tokens, form=form, experts_hit=hit, **moe,
               bf16_us=bf16, default=tiles.config_to_json(MoeTiles()),
               default_us=search.tried[MoeTiles()], best=tiles.config_to_json(best),
               best_us=best_us, budget_hit=search.budget_hit,
               tried=[dict(config=tiles.config_to_json(c), us=us)
                      for c, us in search.tried.items()])  # fmt: skip
    return finish(row, f"moe T={tokens:3d} ({form:7s})", hit * nbytes // E, args)


def shapes_for(args) -> tuple[dict, dict]:
    if args.smoke:
        return {"ragged": (40, 200)}, dict(E=8, k=2, I=128, D=256)
    return (BIG_SHAPES, BIG_MOE) if args.shapes == "big" else (base.SHAPES, base.MOE)


def run(args) -> dict:
    """Rows outer (M = 1 first: the decode goal gets its search before the budget thins),
    then every shape and the experts at T = M tokens."""
    shapes, moe = shapes_for(args)
    rows = (1, 5) if args.smoke else [int(r) for r in args.rows.split(",")]
    left = len(rows) * (len(shapes) + 1)
    end = time.monotonic() + args.budget_s
    linear, experts = [], []
    by_size = sorted(shapes.items(), key=lambda item: item[1][0] * item[1][1])
    for m in rows:
        for name, (n, k) in by_size:  # small first: the big ones find more configs compiled
            share = time.monotonic() + args.greed * (end - time.monotonic()) / left
            linear.append(linear_case(name, n, k, m, linear_weights(n, k, args), args,
                                      min(end, share)))  # fmt: skip
            left -= 1
        share = time.monotonic() + args.greed * (end - time.monotonic()) / left
        experts.append(moe_case(m, moe, args, min(end, share)))
        left -= 1
    return dict(copy_bandwidth_TBps=args.bandwidth / 1e12, linear=linear, moe=experts)


def winners(results: dict, min_gain: float | None) -> tuple[dict, dict]:
    """{key: config} of the cases whose best beat the default by more than min_gain (None:
    every case's best)."""
    linear, moe = {}, {}
    keep = lambda r: min_gain is None or r["best_us"] < r["default_us"] * (1 - min_gain)  # noqa: E731
    for row in results["linear"]:
        if keep(row):
            key = tiles.linear_key(row["rows"], row["n"], row["k"])
            linear[key] = tiles.config_from_json(row["best"])
    for row in results["moe"]:
        if keep(row):
            key = tiles.moe_key(row["tokens"], row["E"], row["k"], row["I"], row["D"])
            moe[key] = tiles.config_from_json(row["best"])
    return linear, moe


def write_table(path: Path, device: str, results: dict, min_gain: float | None, source: str):
    """Merge the winners into the table at `path` (its other keys kept; another device's
    table is replaced)."""
    linear, moe = winners(results, min_gain)
    old = json.loads(path.read_text()) if path.exists() else {}
    if old.get("device") == device:
        linear = {**{k: tiles.config_from_json(v) for k, v in old["linear"].items()}, **linear}
        moe = {**{k: tiles.config_from_json(v) for k, v in old["moe"].items()}, **moe}
    table = tiles.table_json(device, linear, moe, source)
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {path}: {len(linear)} linear, {len(moe)} moe entries")
    return table


def check_table(path: Path, device: str, table: dict) -> None:
    """The written table reads back through `tiles.load_tables` as the picks would see it."""
    loaded = tiles.load_tables(path.parent)[device]
    for part in ("linear", "moe"):
        got = {k: tiles.config_to_json(c) for k, c in loaded[part].items()}
        assert got == table[part], (part, got, table[part])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", choices=("small", "big"), default="small")
    p.add_argument("--rows", default="1,4,16,64", help="rows M (and expert tokens T) to sweep")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--budget-s", type=float, default=300.0, help="search time (+ < 1 min setup)")
    p.add_argument("--rounds", type=int, default=1, help="coordinate-descent rounds per start")
    p.add_argument("--greed", type=float, default=4.0, help="shares of the budget a case may take")
    p.add_argument("--min-gain", type=float, default=0.03)
    p.add_argument("--write-table", default=None)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--name-suffix", default="", help="results file gpu_fp8_sweep{suffix}_h200")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args()
    args.device = "cpu" if args.smoke else "cuda"
    args.options = SMOKE_OPTIONS if args.smoke else OPTIONS
    args.bandwidth = 1.0 if args.smoke else copy_bandwidth()
    suffix = ("" if args.shapes == "small" else "_big") + args.name_suffix
    out = Path(args.out or ROOT / "bench" / "results" / f"gpu_fp8_sweep{suffix}_h200.json")
    t0 = time.monotonic()
    results = run(args)
    cmd = " ".join(["python3", "bench/gpu_fp8_sweep.py", *sys.argv[1:]])
    device = kernels.device_name(torch.device(args.device))
    result = dict(command=cmd, commit=git_commit(), **environment(args.device),
                  workload={k: v for k, v in vars(args).items() if k != "options"},
                  options={c.__name__: {str(f): v for f, v in o.items()}
                           for c, o in args.options.items()},
                  seconds=time.monotonic() - t0, results=results)  # fmt: skip
    if args.smoke:  # a bug check: every best (even the default) round-trips through a table
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "tuned_smoke.json"
            check_table(path, device, write_table(path, device, results, None, cmd))
        return
    write_result(out, args.out_dir, result)
    if args.write_table:
        path = Path(args.write_table)
        check_table(path, device, write_table(path, device, results, args.min_gain, cmd))
        if args.out_dir and path.resolve() != (Path(args.out_dir) / path.name).resolve():
            (Path(args.out_dir) / path.name).write_text(path.read_text())


if __name__ == "__main__":
    main()
