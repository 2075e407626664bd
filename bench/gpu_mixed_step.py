"""Mixed prefill + decode steps on one GPU: each new kernel against the path it replaced, and one
whole mixed step of the bench/gpu_e2e.py model (~1.5B Kimi-Linear shape, vocab 8192) with the new
paths and with the old ones, in the same run.

    moe        `moe.grouped.moe_experts` (device align + grouped GEMM) vs `moe.cpu.moe_experts`
               (bincount on the host, one pair of matmuls per expert), T = the step's tokens
    conv       `short_conv.varlen_kernels.conv_varlen_slots` (slots in place) vs the slot
               gather + `short_conv.cpu.causal_conv1d` + scatter it replaced
    split      the delta rule's decode/chunk split of a mixed step once per step vs rebuilt per
               linear layer (new tensors each layer: fla replans its chunks every layer)
    gqa        `gqa.kernels.paged_gqa` (one Triton launch) vs the dense masked reference, on
               Qwen3-Next's attention shape (the step model below has MLA, not GQA)
    step       8 prompts of 512 tokens prefilled in one step next to 56 decoding sequences
               (8 x 512 + 56 = 4152 tokens): mean time per mixed step, new vs old paths
               (`--old-paths` runs the old ones only, e.g. under a profiler)

    PYTHONPATH=. python3 bench/gpu_mixed_step.py                 # H200, ~3-4 min (fla autotunes)
    PYTHONPATH=. python3 bench/gpu_mixed_step.py --smoke         # CPU, tiny model, a bug check
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

import gpu_e2e  # noqa: E402

from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.layers import state_slots  # noqa: E402
from hyla.ops.moe import cpu as moe_cpu  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402


def time_ms(fn: Callable[[], object], device: str, iters: int = 20, warmup: int = 3) -> float:
    """Median wall time of `fn()` in ms, the device synchronized around each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        gpu_e2e.sync(device)
        t0 = time.perf_counter()
        fn()
        gpu_e2e.sync(device)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


@contextlib.contextmanager
def old_paths() -> Iterator[None]:
    """The paths before the mixed-step kernels: MoE's grouped fallback with its host sync, the
    short conv through slot gather / `causal_conv1d` / scatter, the split rebuilt per layer."""
    from hyla.ops.moe import grouped

    saved = (grouped.moe_experts, state_slots.varlen_conv_runs, state_slots.mixed_split)
    grouped.moe_experts = moe_cpu.moe_experts
    state_slots.varlen_conv_runs = lambda pool, batch: False
    state_slots.mixed_split = state_slots.split_by_length
    try:
        yield
    finally:
        grouped.moe_experts, state_slots.varlen_conv_runs, state_slots.mixed_split = saved


def bench_moe(args: argparse.Namespace, tokens: int) -> dict:
    from hyla.ops.moe import grouped

    dev, dtype = args.device, getattr(torch, args.dtype)
    E, k, D, inter = args.experts, args.experts_per_tok, args.hidden, args.moe_intermediate
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, D, generator=gen).to(dev, dtype)
    w1 = (torch.randn(E, 2 * inter, D, generator=gen) / D**0.5).to(dev, dtype)
    w2 = (torch.randn(E, D, inter, generator=gen) / inter**0.5).to(dev, dtype)
    ids = torch.rand(tokens, E, generator=gen).argsort(dim=1)[:, :k].to(dev)
    w = torch.rand(tokens, k, generator=gen).to(dev)
    new = time_ms(lambda: grouped.moe_experts(x, w1, w2, w, ids), dev)
    old = time_ms(lambda: moe_cpu.moe_experts(x, w1, w2, w, ids), dev)
    diff = (grouped.moe_experts(x, w1, w2, w, ids) - moe_cpu.moe_experts(x, w1, w2, w, ids)).abs()
    row = dict(tokens=tokens, new_ms=new, old_ms=old, speedup=old / new,
               max_abs_diff=float(diff.max()))  # fmt: skip
    print(f"moe  T={tokens:5d}: grouped {new:7.3f} ms  old {old:7.3f} ms  {old / new:5.2f}x")
    return row


def mixed_lens(args: argparse.Namespace) -> list[int]:
    return [args.prefill_len] * args.prefills + [1] * args.decodes


def bench_conv(args: argparse.Namespace) -> dict:
    from hyla.ops.short_conv.cpu import causal_conv1d
    from hyla.ops.short_conv.varlen_kernels import conv_varlen_slots

    dev, dtype = args.device, getattr(torch, args.dtype)
    lens = mixed_lens(args)
    N, T, C, W = len(lens), sum(lens), 3 * args.heads * args.head_dim, 4
    gen = torch.Generator().manual_seed(1)
    pool = torch.randn(N + 8, C, W - 1, generator=gen).to(dev, dtype)
    slots = torch.randperm(N + 8, generator=gen)[:N].to(dev)
    x = torch.randn(T, C, generator=gen).to(dev, dtype)
    weight = torch.randn(C, W, generator=gen).to(dev, dtype)
    cu_host = torch.tensor([0] + lens).cumsum(0).tolist()
    cu = torch.tensor(cu_host, dtype=torch.int32, device=dev)
    fresh = torch.arange(args.prefills, device=dev)  # the prompts start from zeros
    has_state = torch.tensor([0] * args.prefills + [1] * args.decodes, device=dev)

    def old() -> None:
        state = pool.index_select(0, slots)
        state.index_fill_(0, fresh, 0)
        y, new_state = causal_conv1d(x, weight, None, cu, state, "silu", cu_seqlens_host=cu_host)
        pool.index_copy_(0, slots, new_state)

    new_ms = time_ms(lambda: conv_varlen_slots(x, weight, None, cu, pool, slots, has_state), dev)
    old_ms = time_ms(old, dev)
    print(f"conv T={T:5d} C={C}: varlen kernel {new_ms:7.3f} ms  old {old_ms:7.3f} ms  "
          f"{old_ms / new_ms:5.2f}x")  # fmt: skip
    return dict(tokens=T, channels=C, new_ms=new_ms, old_ms=old_ms, speedup=old_ms / new_ms)


def bench_gqa(args: argparse.Namespace) -> dict:
    """Qwen3-Next's attention shape (16 query heads over 2 kv heads, head_dim 256, 16-token
    pages) on the mixed step's lengths (decoders with `decode_context` tokens cached)."""
    from hyla.ops.gqa import kernels, reference

    dev, dtype = args.device, getattr(torch, args.dtype)
    H, HKV, D, page = 16, 2, 256, 16
    q_lens = mixed_lens(args)
    seq_lens = [n if n > 1 else args.decode_context + 1 for n in q_lens]
    pages = [-(-n // page) for n in seq_lens]
    gen = torch.Generator().manual_seed(2)
    k_cache = torch.randn(sum(pages), page, HKV, D, generator=gen).to(dev, dtype)
    v_cache = torch.randn(sum(pages), page, HKV, D, generator=gen).to(dev, dtype)
    tables = torch.zeros(len(q_lens), max(pages), dtype=torch.int32)
    first = 0
    for i, p in enumerate(pages):
        tables[i, :p] = torch.arange(first, first + p)
        first += p
    tables = tables.to(dev)
    q = torch.randn(sum(q_lens), H, D, generator=gen).to(dev, dtype)
    cu = torch.tensor([0] + q_lens).cumsum(0).to(dev, torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
    a = (q, k_cache, v_cache, tables, cu)
    new = time_ms(lambda: kernels.paged_gqa(*a, lens, D**-0.5), dev)
    old = time_ms(lambda: reference.paged_gqa(*a, seq_lens, D**-0.5), dev, iters=5)
    got, want = kernels.paged_gqa(*a, lens, D**-0.5), reference.paged_gqa(*a, seq_lens, D**-0.5)
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    print(f"gqa  T={q.shape[0]:5d}: paged kernel {new:7.3f} ms  dense reference {old:7.3f} ms  "
          f"{old / new:5.2f}x  (max rel diff {err:.1e})")  # fmt: skip
    return dict(tokens=q.shape[0], new_ms=new, old_ms=old, speedup=old / new, max_rel_diff=err)


def build_engine(args: argparse.Namespace, path: str) -> LLMEngine:
    """Without decode CUDA graphs (mixed steps run eagerly either way; capturing every decode
    bucket would only lengthen the start)."""
    return LLMEngine.from_path(
        path, device=args.device, dtype=args.dtype, max_num_seqs=args.prefills + args.decodes,
        max_num_batched_tokens=max(8192, args.prefills * args.prefill_len + args.decodes),
        max_model_len=args.context + args.prefill_len + 64, enable_prefix_caching=False,
        kv_cache_memory=args.kv_cache_gib << 30, enforce_eager=True,
    )  # fmt: skip


def start_decoders(engine: LLMEngine, args: argparse.Namespace) -> None:
    """`args.decodes` sequences past their prefill, decoding with plenty of tokens left."""
    prompts = gpu_e2e.random_prompts(args.decodes, args.decode_context, args.vocab, seed=7)
    params = SamplingParams(temperature=0, max_tokens=args.context, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"dec-{i}", p, params)
    started: set[str] = set()
    while len(started) < args.decodes:
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)


def mixed_steps(engine: LLMEngine, args: argparse.Namespace, tag: str, rounds: int) -> dict:
    """`rounds` times: add `args.prefills` prompts (one output token each, so they leave after
    their prefill step) and step until they finish. Returns the mean time per step that ran a
    prefill and the first tokens of the prompts."""
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    firsts: dict[str, list[int]] = {}
    steps = 0
    gpu_e2e.sync(args.device)
    t0 = time.perf_counter()
    for r in range(rounds):
        prompts = gpu_e2e.random_prompts(args.prefills, args.prefill_len, args.vocab, seed=100 + r)
        ids = [f"{tag}-{r}-{i}" for i in range(args.prefills)]
        for rid, p in zip(ids, prompts, strict=True):
            engine.add_request(rid, p, params)
        while not all(rid in firsts for rid in ids):
            for out in engine.step():
                if out.request_id in ids and out.finished:
                    firsts[out.request_id] = out.outputs[0].token_ids
            steps += 1
    gpu_e2e.sync(args.device)
    seconds = time.perf_counter() - t0
    firsts_in_order = [firsts[k] for k in sorted(firsts)]
    return dict(rounds=rounds, steps=steps, step_ms=1e3 * seconds / steps,
                round_ms=1e3 * seconds / rounds, firsts=firsts_in_order)  # fmt: skip


def bench_step(args: argparse.Namespace) -> dict:
    dtype = getattr(torch, args.dtype)
    hf = gpu_e2e.build_hf_model(args, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        del hf
        engine = build_engine(args, tmp)
    start_decoders(engine, args)
    rows = {}
    modes = ["old"] if args.old_paths else ["new", "old"]
    for mode in modes:
        with old_paths() if mode == "old" else contextlib.nullcontext():
            mixed_steps(engine, args, f"warm-{mode}", 2)  # compiles, autotunes
            rows[mode] = mixed_steps(engine, args, mode, args.rounds)
        print(f"mixed step ({mode} paths): {rows[mode]['step_ms']:8.2f} ms per step "
              f"({rows[mode]['steps']} steps for {args.rounds} rounds of {args.prefills} x "
              f"{args.prefill_len} prefill + {args.decodes} decodes)", flush=True)  # fmt: skip
    result = {f"{m}_paths": {k: v for k, v in r.items() if k != "firsts"} for m, r in rows.items()}
    if len(rows) == 2:
        result["speedup"] = rows["old"]["step_ms"] / rows["new"]["step_ms"]
        same = sum(
            a == b for a, b in zip(rows["new"]["firsts"], rows["old"]["firsts"], strict=True)
        )
        result["same_first_tokens"] = f"{same}/{len(rows['new']['firsts'])}"
        print(f"mixed step old / new: {result['speedup']:.2f}x; same first tokens "
              f"{result['same_first_tokens']}")  # fmt: skip
    return result


def record(args: argparse.Namespace, results: dict, start: float) -> None:
    """Write what was measured so far (a run killed in the whole-step part keeps the kernels')."""
    if args.no_save:
        return
    result = {
        "command": " ".join(["python3", "bench/gpu_mixed_step.py", *sys.argv[1:]]),
        "commit": gpu_e2e.git_commit(),
        **gpu_e2e.environment(args.device),
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "out_dir")},
        "results": results,
        "wall_s": time.perf_counter() - start,
    }
    gpu_e2e.write_result(Path(args.out), args.out_dir, result)


def run(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    out: dict = {}
    if args.device.startswith("cuda") and not args.old_paths:
        T = args.prefills * args.prefill_len + args.decodes
        out["moe"] = [bench_moe(args, t) for t in (512, T)]
        out["short_conv"] = bench_conv(args)
        record(args, out, start)
        out["gqa_prefill"] = bench_gqa(args)
        record(args, out, start)
    out["mixed_step"] = bench_step(args)
    record(args, out, start)
    print(f"total {time.perf_counter() - start:.1f} s")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, fp32: a bug check")
    p.add_argument("--old-paths", action="store_true", help="only the old paths (profiling)")
    p.add_argument("--prefills", type=int, default=8)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--decodes", type=int, default=56)
    p.add_argument("--decode-context", type=int, default=256, help="decoders' prompt length")
    p.add_argument("--context", type=int, default=1024, help="decoders' max_tokens")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", default=str(ROOT / "results" / "gpu_mixed_step_h200.json"))
    p.add_argument("--out-dir", default=None, help="also copy the JSON here (e.g. $OUT)")
    p.add_argument("--no-save", action="store_true")
    own, rest = p.parse_known_args(argv)
    model = gpu_e2e.parse_args(["--vocab", "8192", *rest, *(["--smoke"] if own.smoke else [])])
    for key, value in vars(own).items():
        setattr(model, key, value)
    model.no_save = own.no_save or own.smoke
    if own.smoke:
        model.prefills, model.prefill_len, model.decodes, model.rounds = 2, 24, 3, 2
        model.decode_context, model.context = 8, 64
    return model


def main() -> None:
    args = parse_args()
    if args.smoke:  # fla's kernels need a GPU: let transformers take its PyTorch fallback
        sys.modules["fla"] = None  # type: ignore[assignment]
    run(args)


if __name__ == "__main__":
    main()
