"""KDA and Gated DeltaNet on CUDA: hyla's public ops (and the layer-level slot step) vs fla-core
called directly on the same tensors, in one run on one GPU.

    PYTHONPATH=. python3 bench/gpu_linear_attention.py [--prefill-only]

Prefill: chunk ops, 32 value heads x 128 (KDA H = 32, GDN H = 16 as in Qwen3-Next), bf16 inputs,
fp32 gates and states, T = 8K / 32K / 128K tokens as N = 1 or 8 sequences (random lengths);
each case is measured in 3 interleaved rounds (fla, hyla, fla, ...; 7 at T <= 8K, where a call is
host-bound and single rounds moved up to 2x), the median of each side kept (and the minimum:
`hyla_over_fla_min`).
hyla gets the host copy of cu_seqlens as the engine passes it (`cu_seqlens_cpu`); the sides are
fla as its docs call it (device cu_seqlens only: fla reads them back, a sync per call) and fla
given the same host copy (`hyla_over_fla_host_offsets`: the wrapper's own cost).
Decode: one token for each of B = 1 / 16 / 64 / 256 sequences whose states sit at random slots
of a 512-slot fp32 pool. Variants:

    fla          fla's public op on a [B, HV, K, V] state (out of place; the PERFORMANCE.md figure)
    fla_pool     fla's fused recurrent KDA kernel reading/writing the pool through
                 ssm_state_indices (vLLM's way; the floor for any wrapper)
    hyla_op      hyla.ops.{kda,gdn}.recurrent_* with state_indices on the pool, in place
    hyla_layer   hyla.layers.state_slots.delta_rule_step on a ForwardBatch (what the model runs)
    gather_scatter  pool rows gathered, hyla op, rows scattered back (the CPU-style path)

Reports per case: times (us), hyla/fla ratios (goal <= 1.10) and, for decode, the fraction of the
measured copy bandwidth reached (state bytes read + written / time / D2D copy read+write rate).
Writes bench/results/gpu_linear_attention_h200.json (and $OUT/ when set).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from hyla.forward_batch import build_forward_batch
from hyla.layers.state_slots import delta_rule_step
from hyla.ops import gdn, kda

HV, K, V = 32, 128, 128
HEADS = {"kda": 32, "gdn": 16}  # key heads H
PREFILL_T = (8192, 32768, 131072)
PREFILL_N = (1, 8)
DECODE_B = (1, 16, 64, 256)
NUM_SLOTS = 512
PREFILL_ROUNDS = 3  # interleaved fla/hyla measurements per prefill case
SHORT_PREFILL_ROUNDS = 7  # at T <= 8K a call is host-bound: single rounds moved 1.3 -> 2.5 ms
TIME_BUDGET_S = 200.0  # cases left when this much has passed are recorded as skipped
RESULTS = Path("bench/results/gpu_linear_attention_h200.json")


def _us(fn, rep: int = 50) -> float:
    return do_bench(fn, warmup=10, rep=rep) * 1e3  # ms -> us


def copy_bandwidth() -> float:
    """Device-to-device copy rate, bytes read + written per second (2 GiB each way)."""
    src = torch.empty(2**29, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    t = _us(lambda: dst.copy_(src)) * 1e-6
    return 2 * src.numel() * 4 / t


def _lens(T: int, N: int) -> list[int]:
    cuts = sorted(random.Random(T + N).sample(range(1, T), N - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, T], strict=True)]


def _inputs(kind: str, T: int, N: int, gen: torch.Generator) -> dict:
    H = HEADS[kind]
    g_shape = (T, HV, K) if kind == "kda" else (T, HV)
    lens = _lens(T, N)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16, "generator": gen}
    return {  # inputs drawn on the GPU: a 128K-token prefill is billions of numbers
        "q": torch.randn(T, H, K, **bf16),
        "k": torch.randn(T, H, K, **bf16),
        "v": torch.randn(T, HV, V, **bf16),
        "g": -torch.rand(g_shape, device="cuda", generator=gen).mul_(0.1).add_(1e-3),
        "beta": torch.rand(T, HV, **bf16),
        "cu": torch.tensor([0, *lens]).cumsum(0).to("cuda", torch.int32),
    }


def bench_prefill(kind: str, T: int, N: int, gen: torch.Generator) -> dict:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdr
    from fla.ops.kda import chunk_kda as fla_kda

    x = _inputs(kind, T, N, gen)
    h0 = torch.zeros(N, HV, K, V, device="cuda")
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    rows = [a.unsqueeze(0) for a in args]
    cu_long = x["cu"].long()
    hyla_op = kda.chunk_kda if kind == "kda" else gdn.chunk_gated_delta_rule
    fla_op = fla_kda if kind == "kda" else fla_gdr

    # Both sides get a fresh cu_seqlens tensor per call, as a serving step does: fla caches its
    # chunk plan per cu_seqlens tensor, and a reused tensor would hide that cost from one side.
    def fla() -> None:
        q, k, v, g, beta = rows
        fla_op(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True,
               use_qk_l2norm_in_kernel=True, cu_seqlens=cu_long.clone())  # fmt: skip

    cu_host = cu_long.cpu()

    def hyla() -> None:  # as the engine calls it: with the step's host offsets
        hyla_op(*args, x["cu"].clone(), h0, use_qk_l2norm=True, inplace_state=True,
                cu_seqlens_cpu=cu_host.clone())  # fmt: skip

    def fla_host_offsets() -> None:  # fla as hyla calls it: with the host copy of cu_seqlens
        q, k, v, g, beta = rows
        fla_op(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True,
               use_qk_l2norm_in_kernel=True, cu_seqlens=cu_long.clone(),
               cu_seqlens_cpu=cu_host.clone())  # fmt: skip

    # Interleaved rounds (fla, hyla, fla, hyla, ...), the median of each side: one slow stretch
    # of the machine (clocks, a neighbour) moved single measurements by up to 2x.
    rep = 30 if T > 50_000 else 60
    fns = (fla, hyla, fla_host_offsets)
    num_rounds = SHORT_PREFILL_ROUNDS if T <= 8192 else PREFILL_ROUNDS
    rounds = [tuple(_us(fn, rep) for fn in fns) for _ in range(num_rounds)]
    t_fla, t_hyla, t_fla_host = (statistics.median(r[i] for r in rounds) for i in range(3))
    best = [min(r[i] for r in rounds) for i in range(3)]  # noise only adds time
    return {
        "op": kind, "T": T, "N": N, "fla_us": t_fla, "hyla_us": t_hyla,
        "hyla_over_fla": t_hyla / t_fla, "fla_Mtok_per_s": T / t_fla, "hyla_Mtok_per_s": T / t_hyla,
        "fla_host_offsets_us": t_fla_host, "hyla_over_fla_host_offsets": t_hyla / t_fla_host,
        "min_us": best, "hyla_over_fla_min": best[1] / best[0],
        "rounds_us": rounds,
    }  # fmt: skip


def bench_decode(kind: str, B: int, gen: torch.Generator, bandwidth: float) -> dict:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_gdr
    from fla.ops.kda import fused_recurrent_kda as fla_kda
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    x = _inputs(kind, B, B, gen)
    pool = torch.randn(NUM_SLOTS, HV, K, V, device="cuda", generator=gen).mul_(0.1)
    slots = torch.tensor(random.Random(B).sample(range(NUM_SLOTS), B), device="cuda")
    states = pool[slots].clone()
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    rows = [a.unsqueeze(0) for a in args]
    g_kda = rows[3] if kind == "kda" else rows[3].unsqueeze(-1).expand(1, B, HV, K).contiguous()
    recurrent = kda.recurrent_kda if kind == "kda" else gdn.recurrent_gated_delta_rule
    chunk = kda.chunk_kda if kind == "kda" else gdn.chunk_gated_delta_rule
    batch = build_forward_batch([1] * B, [5] * B, [[0]] * B, slots.tolist(), 16, [], "cuda")
    cache = {"recurrent_state": pool}
    fla_op = fla_kda if kind == "kda" else fla_gdr

    def fla() -> None:
        q, k, v, g, beta = rows
        fla_op(q=q, k=k, v=v, g=g, beta=beta, initial_state=states, output_final_state=True,
               use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu"])  # fmt: skip

    def fla_pool() -> None:
        fused_recurrent_kda_fwd(rows[0], rows[1], rows[2], g_kda, rows[4], initial_state=pool,
                                inplace_final_state=True, cu_seqlens=x["cu"],
                                ssm_state_indices=slots, use_qk_l2norm_in_kernel=True)  # fmt: skip

    def hyla_op() -> None:
        recurrent(*args, x["cu"], pool, use_qk_l2norm=True, inplace_state=True,
                  state_indices=slots)  # fmt: skip

    def hyla_layer() -> None:
        delta_rule_step(chunk, recurrent, *args, cache, batch)

    def gather_scatter() -> None:
        s = pool.index_select(0, slots)
        _, final = recurrent(*args, x["cu"], s, use_qk_l2norm=True, inplace_state=True)
        pool.index_copy_(0, slots, final)

    variants = {"fla": fla, "fla_pool": fla_pool, "hyla_op": hyla_op, "hyla_layer": hyla_layer,
                "gather_scatter": gather_scatter}  # fmt: skip
    times = {name: _us(fn) for name, fn in variants.items()}
    state_bytes = 2 * B * HV * K * V * 4  # each state read once and written once
    return {
        "op": kind, "B": B, **{f"{n}_us": t for n, t in times.items()},
        "hyla_op_over_fla": times["hyla_op"] / times["fla"],
        "hyla_layer_over_fla": times["hyla_layer"] / times["fla"],
        "hyla_op_over_fla_pool": times["hyla_op"] / times["fla_pool"],
        **{f"{n}_bw_fraction": state_bytes / (t * 1e-6) / bandwidth for n, t in times.items()},
    }  # fmt: skip


def _commit() -> str:
    from throughput import git_commit  # bench/throughput.py: reads .git without git

    return git_commit() or "unknown"


def main() -> None:
    import fla

    from hyla.ops.kda import kernels

    if not kernels.fla_available():
        sys.exit("fla-core does not import (is einops installed?)")
    start = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    bandwidth = copy_bandwidth()
    print(f"D2D copy: {bandwidth / 1e12:.2f} TB/s read+write")
    prefill, decode, skipped = [], [], []
    with torch.inference_mode():
        for kind in ("kda", "gdn") if "--prefill-only" not in sys.argv else ():
            for B in DECODE_B:
                r = bench_decode(kind, B, gen, bandwidth)
                decode.append(r)
                print(
                    f"decode {kind} B={B:3d}: fla {r['fla_us']:7.1f} us | fla_pool "
                    f"{r['fla_pool_us']:7.1f} | hyla_op {r['hyla_op_us']:7.1f} "
                    f"({r['hyla_op_over_fla']:.2f}x fla) | layer {r['hyla_layer_us']:7.1f} "
                    f"({r['hyla_layer_over_fla']:.2f}x) | gather/scatter "
                    f"{r['gather_scatter_us']:7.1f} | bw hyla_op {r['hyla_op_bw_fraction']:.0%}"
                )
        for kind in ("kda", "gdn"):
            for T in PREFILL_T:
                for N in PREFILL_N:
                    if time.time() - start > TIME_BUDGET_S:
                        skipped.append({"op": kind, "T": T, "N": N})
                        continue
                    r = bench_prefill(kind, T, N, gen)
                    prefill.append(r)
                    print(
                        f"prefill {kind} T={T:6d} N={N}: fla {r['fla_us']:9.1f} us "
                        f"({r['fla_Mtok_per_s']:.2f} M tok/s) | hyla {r['hyla_us']:9.1f} us "
                        f"({r['hyla_over_fla']:.3f}x) | fla + host cu_seqlens "
                        f"{r['fla_host_offsets_us']:9.1f} us "
                        f"({r['hyla_over_fla_host_offsets']:.3f}x)"
                    )
                    torch.cuda.empty_cache()
    doc = {
        "command": " ".join(["PYTHONPATH=. python3 bench/gpu_linear_attention.py", *sys.argv[1:]]),
        "commit": _commit(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "fla": getattr(fla, "__version__", "unknown"),
        "results": {
            "copy_bandwidth_TBps": bandwidth / 1e12,
            "shape": {"HV": HV, "K": K, "V": V, "H": HEADS, "state_pool_slots": NUM_SLOTS},
            "decode": decode,
            "prefill": prefill,
            "skipped_for_time": skipped,
            "seconds": time.time() - start,
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    if os.environ.get("OUT"):
        shutil.copy(RESULTS, Path(os.environ["OUT"]) / RESULTS.name)
    print(f"wrote {RESULTS} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
