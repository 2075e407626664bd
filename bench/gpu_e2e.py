"""End to end on one GPU: hyla vs transformers `generate` on a ~1.5B Kimi-Linear-shaped model.

A random-weight `transformers` KimiLinear model ([KDA, KDA, KDA, MLA] x 3, MoE FFNs after a
dense first layer, bf16) is saved with `save_pretrained` and loaded into hyla with hyla's own
loader, so both engines run the very same weights on the same GPU in the same process:

    decode   hyla's offline engine (greedy, ignore_eos, fixed output length) at batch 1/16/64:
             tokens/s, step time, and model-bandwidth utilisation, with CUDA graphs (the
             default) and again eagerly (the same engine with its graphs set aside), and with
             async scheduling off (each step scheduled after the last one's tokens arrive)
                 MBU = bytes one decode step must read / step time / measured D2D bandwidth
             bytes = weights (routed experts: only the expected distinct experts the batch
             hits, uniform routing) + MLA latent cache of the batch's contexts + recurrent and
             conv state (read and written); D2D bandwidth = 2 * bytes copied / copy time
    prefill  one prompt of 8K (and 128K on request) tokens: tokens/s to the first token
    baseline transformers `generate` on the same weights, same batches and prompt length;
             decode tokens/s from generate(N) - generate(1), ratios hyla / transformers

    PYTHONPATH=. python3 bench/gpu_e2e.py                       # H200, ~3 min
    PYTHONPATH=. python3 bench/gpu_e2e.py --quick               # fewer points
    PYTHONPATH=. python3 bench/gpu_e2e.py --smoke               # CPU, tiny model, a bug check
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hyla.cache.spec import bytes_per_state_slot, bytes_per_token  # noqa: E402
from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402

LINEAR, FULL = "linear_attention", "full_attention"


# ---- shared with bench/gpu_long_context.py ---------------------------------------------------


def git_commit() -> str:
    """HEAD's commit (`bench/throughput.py` reads the .git files, no git command), or "unknown"."""
    from throughput import git_commit as read_head

    return read_head() or "unknown"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting read + write (2 * nbytes
    per copy), as in shared/PERFORMANCE.md."""
    if not device.startswith("cuda"):
        nbytes, iters = 64 << 20, 3
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        seconds = (time.perf_counter() - t0) / iters
    del src, dst
    return 2 * nbytes / seconds


def environment(device: str) -> dict:
    info = {"torch": torch.__version__, "gpu": None, "triton": None, "fla": None}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    for name in ("triton", "fla", "transformers"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - absent or broken: recorded as None
            info[name] = None
    return info


def write_result(path: Path, out_dir: str | None, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2) + "\n"
    path.write_text(text)
    print(f"wrote {path}")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / path.name).write_text(text)
        print(f"wrote {Path(out_dir) / path.name}")


def random_prompts(num: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (num, length), generator=gen).tolist()


def run_engine(
    engine: LLMEngine, prompts: list[list[int]], max_tokens: int, device: str, tag: str
) -> dict:
    """Run `prompts` to `max_tokens` greedy tokens each; time the prefill steps (until every
    request has its first token) and the decode steps after them separately."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", p, params)
    started: set[str] = set()
    sync(device)
    t0 = time.perf_counter()
    prefill_steps = 0
    while len(started) < len(prompts):
        for out in engine.step():
            if out.outputs[0].token_ids:
                started.add(out.request_id)
        prefill_steps += 1
    sync(device)
    t1 = time.perf_counter()
    decode_steps = 0
    final: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
        decode_steps += 1
    sync(device)
    t2 = time.perf_counter()
    tokens = [final.get(f"{tag}-{i}") for i in range(len(prompts))]
    return dict(
        prefill_s=t1 - t0, prefill_steps=prefill_steps, decode_s=t2 - t1,
        decode_steps=decode_steps, tokens=tokens,
    )  # fmt: skip


# ---- this benchmark --------------------------------------------------------------------------


def hf_config(args: argparse.Namespace):
    """A Kimi-Linear-shaped transformers config (~1.5B parameters by default)."""
    from transformers import KimiLinearConfig

    layers, experts, top_k = args.layers, args.experts, args.experts_per_tok
    heads, head_dim = args.heads, args.head_dim
    cfg = KimiLinearConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        moe_intermediate_size=args.moe_intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, kv_lora_rank=args.kv_lora_rank,
        q_lora_rank=None, qk_rope_head_dim=head_dim // 2, qk_nope_head_dim=head_dim,
        v_head_dim=head_dim, num_local_experts=experts, num_experts_per_tok=top_k,
        n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.446,
        norm_topk_prob=True,
        linear_attn_config={"head_dim": head_dim, "num_heads": heads, "short_conv_kernel_size": 4},
        layer_types=([LINEAR, LINEAR, LINEAR, FULL] * layers)[:layers],
        mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
        max_position_embeddings=max(args.prefill_lens + [args.prompt_len]) + 256,
        rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    got = (getattr(cfg, "num_local_experts", None), getattr(cfg, "num_experts_per_tok", None))
    if got != (experts, top_k):
        raise RuntimeError(f"KimiLinearConfig ignored the MoE fields: got {got}")
    return cfg


def build_hf_model(args: argparse.Namespace, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(hf_config(args), dtype=dtype)
    return model.eval()


def decode_bytes(model, batch: int, mean_context: float) -> dict:
    """Bytes one decode step of `batch` sequences must move (see the module docstring)."""
    config = model.config
    expert_bytes, other_bytes, num_moe = 0, 0, 0
    for name, p in model.named_parameters():
        nbytes = p.numel() * p.element_size()
        if ".experts." in name:
            expert_bytes += nbytes
            num_moe += name.endswith("gate_up_proj")
        elif name == "embed_tokens.weight" and not config.tie_word_embeddings:
            other_bytes += batch * nbytes // p.shape[0]  # only the batch's rows
        else:
            other_bytes += nbytes
    hit_experts = 0.0
    if config.moe is not None and num_moe:
        e, k = config.moe.num_experts, config.moe.num_experts_per_tok
        hit_experts = e * (1 - (1 - k / e) ** batch)  # expected distinct experts per layer
        expert_bytes = expert_bytes * hit_experts / e
    kv = bytes_per_token(config) * batch * mean_context
    state = 2 * bytes_per_state_slot(config) * batch  # read + written
    total = other_bytes + expert_bytes + kv + state
    return dict(weights=other_bytes, experts=expert_bytes, expected_experts_hit=hit_experts,
                kv_cache=kv, state=state, total=total)  # fmt: skip


def hyla_engine(path: str, args: argparse.Namespace) -> LLMEngine:
    longest = max(args.prefill_lens + [args.prompt_len + args.decode_tokens])
    return LLMEngine.from_path(
        path, device=args.device, dtype=args.dtype, max_num_seqs=max(args.batches),
        max_num_batched_tokens=args.chunk, max_model_len=longest + 16,
        enable_prefix_caching=False, kv_cache_memory=args.kv_cache_gib << 30,
    )  # fmt: skip


def hyla_decode(
    engine: LLMEngine,
    args: argparse.Namespace,
    bandwidth: float,
    eager: bool = False,
    sync_scheduling: bool = False,
) -> list[dict]:
    """Decode rows per batch size; `eager` runs them without the engine's CUDA graphs (the
    same engine, graphs set aside), as the in-run baseline of what the graphs buy;
    `sync_scheduling` with async scheduling off (each step scheduled after the previous one's
    tokens reached the host), the in-run baseline of what async scheduling buys."""
    rows = []
    graphs, step = engine.runner.graphs, engine.step
    if eager:
        engine.runner.graphs = None
    if sync_scheduling:  # read each step's tokens before the next one is scheduled
        engine.step = lambda: step() + engine.flush()
    tag = "eager" if eager else ("graphs" if graphs is not None else "eager")
    tag += "_sync_sched" if sync_scheduling else ""
    try:
        for b in args.batches:
            prompts = random_prompts(b, args.prompt_len, args.vocab, seed=b)
            # same lengths as the timed run: compiles, autotunes, captures every context bucket
            run_engine(engine, prompts, args.decode_tokens + 1, args.device, f"warm{tag}{b}")
            t = run_engine(engine, prompts, args.decode_tokens + 1, args.device, f"{tag}{b}")
            step_s = t["decode_s"] / t["decode_steps"]
            moved = decode_bytes(engine.model, b, args.prompt_len + args.decode_tokens / 2)
            row = dict(batch=b, mode=tag, decode_steps=t["decode_steps"], step_ms=1e3 * step_s,
                       tokens_per_s=b / step_s, bytes_per_step=moved,
                       mbu=moved["total"] / step_s / bandwidth, tokens=t["tokens"])  # fmt: skip
            rows.append(row)
            print(f"hyla decode ({tag:17s}) B={b:3d}: {row['tokens_per_s']:9.1f} tok/s  step "
                  f"{row['step_ms']:7.2f} ms  MBU {100 * row['mbu']:5.1f}%")  # fmt: skip
    finally:
        engine.runner.graphs = graphs
        engine.__dict__.pop("step", None)
    return rows


def hyla_prefill(engine: LLMEngine, args: argparse.Namespace) -> list[dict]:
    rows = []
    for n in args.prefill_lens:
        prompt = random_prompts(1, n, args.vocab, seed=n)
        run_engine(engine, [prompt[0][: min(n, args.chunk)]], 1, args.device, f"pwarm{n}")
        t = run_engine(engine, prompt, 1, args.device, f"pre{n}")
        rows.append(dict(prompt_len=n, chunk=args.chunk, ttft_s=t["prefill_s"],
                         steps=t["prefill_steps"], tokens_per_s=n / t["prefill_s"]))  # fmt: skip
        print(
            f"hyla prefill {n:7d}: {n / t['prefill_s']:10.0f} tok/s  TTFT "
            f"{t['prefill_s']:.3f} s in {t['prefill_steps']} steps",
            flush=True,
        )
    return rows


def hf_generate_s(model, input_ids: torch.Tensor, new_tokens: int, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
    )  # fmt: skip
    sync(device)
    return time.perf_counter() - t0


@torch.inference_mode()
def hf_decode(model, args: argparse.Namespace) -> list[dict]:
    rows = []
    n = args.hf_tokens
    for b in args.batches:
        prompts = random_prompts(b, args.prompt_len, args.vocab, seed=b)
        ids = torch.tensor(prompts, device=args.device)
        hf_generate_s(model, ids, 2, args.device)  # warm-up
        # the faster of two runs: its step is host-bound and noisy (a conservative baseline)
        runs = []
        for _ in range(2):
            first = hf_generate_s(model, ids, 1, args.device)
            full = hf_generate_s(model, ids, n, args.device)
            runs.append((max(full - first, 1e-9) / (n - 1), first, full))
        step_s, first, full = min(runs)
        rows.append(dict(batch=b, new_tokens=n, generate_s=full, prefill_s=first,
                         step_ms=1e3 * step_s, tokens_per_s=b / step_s))  # fmt: skip
        print(f"hf   decode  B={b:3d}: {b / step_s:9.1f} tok/s  step {1e3 * step_s:7.2f} ms",
              flush=True)  # fmt: skip
    return rows


def run(args: argparse.Namespace) -> dict:
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth(args.device)
    print(f"D2D copy bandwidth: {bandwidth / 1e12:.3f} TB/s (read + write)", flush=True)
    t0 = time.perf_counter()
    hf = build_hf_model(args, dtype)
    num_params = sum(p.numel() for p in hf.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        engine = hyla_engine(tmp, args)
    print(f"models built, saved and loaded in {time.perf_counter() - t0:.1f} s: "
          f"{num_params / 1e9:.3f} B parameters; hyla cache {engine.cache_plan.describe()}",
          flush=True)  # fmt: skip
    decode = hyla_decode(engine, args, bandwidth)
    eager = [] if args.skip_eager else hyla_decode(engine, args, bandwidth, eager=True)
    sync_sched = []
    if not args.skip_sync_scheduling:
        sync_sched = hyla_decode(engine, args, bandwidth, sync_scheduling=True)
    prefill = hyla_prefill(engine, args)
    baseline = [] if args.skip_hf else hf_decode(hf, args)
    ratios = {
        f"decode_B{h['batch']}": d["tokens_per_s"] / h["tokens_per_s"]
        for d, h in zip(decode, baseline, strict=False)
    }
    graph_gain = {
        f"decode_B{g['batch']}": e["step_ms"] / g["step_ms"]
        for g, e in zip(decode, eager, strict=False)
    }
    for key, value in ratios.items():
        print(f"hyla / transformers {key}: {value:.2f}x")
    sched_gain = {
        f"decode_B{a['batch']}": o["step_ms"] / a["step_ms"]
        for a, o in zip(decode, sync_sched, strict=False)
    }
    # the same greedy tokens with and without async scheduling (and eagerly: argmax ties aside)
    same_tokens = {
        f"decode_B{a['batch']}": a["tokens"] == o["tokens"]
        for a, o in zip(decode, sync_sched, strict=False)
    }
    for row in decode + eager + sync_sched:
        del row["tokens"]
    print(f"greedy tokens equal with and without async scheduling: {same_tokens}")
    for key, value in graph_gain.items():
        print(f"CUDA graphs / eager {key}: {value:.2f}x")
    for key, value in sched_gain.items():
        print(f"async scheduling / sync scheduling {key}: {value:.2f}x")
    mbu1 = next((d["mbu"] for d in decode if d["batch"] == 1), None)
    return dict(
        copy_bandwidth_bytes_per_s=bandwidth,
        model=dict(
            parameters=num_params,
            layer_pattern=list(engine.model_config.layer_pattern),
            hidden=args.hidden,
            experts=args.experts,
            experts_per_tok=args.experts_per_tok,
            dtype=args.dtype,
        ),  # fmt: skip
        hyla_decode=decode,
        hyla_decode_eager=eager,
        cuda_graph_speedup=graph_gain,
        hyla_decode_sync_scheduling=sync_sched,
        async_scheduling_speedup=sched_gain,
        async_scheduling_same_tokens=same_tokens,
        hyla_prefill=prefill,
        transformers_decode=baseline,
        speedup_vs_transformers=ratios,
        goals=dict(
            speedup_B64_ge_20x=ratios.get("decode_B64", 0) >= 20 if baseline else None,
            mbu_B1_ge_60pct=None if mbu1 is None else mbu1 >= 0.6,
        ),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quick", action="store_true", help="batches 1,64; 32 decode tokens")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, fp32: a bug check")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--hf-tokens", type=int, default=32)
    p.add_argument("--prefill-lens", default="8192", help="comma list, e.g. 8192,131072")
    p.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--kv-cache-gib", type=int, default=8)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-eager", action="store_true", help="no eager (graph-less) decode rows")
    p.add_argument("--skip-sync-scheduling", action="store_true",
                   help="no decode rows with async scheduling off")  # fmt: skip
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--kv-lora-rank", type=int, default=512)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--experts-per-tok", type=int, default=4)
    p.add_argument("--moe-intermediate", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_e2e_h200.json"))
    p.add_argument("--out-dir", default=None, help="also copy the JSON here (e.g. $OUT)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.decode_tokens, args.hf_tokens = "1,64", 32, 16
    if args.smoke:
        args.device, args.dtype, args.batches = "cpu", "float32", "1,4"
        args.prompt_len, args.decode_tokens, args.hf_tokens, args.chunk = 16, 4, 4, 256
        args.prefill_lens, args.kv_cache_gib, args.layers, args.hidden = "256", 1, 4, 64
        args.heads, args.head_dim, args.kv_lora_rank = 2, 16, 32
        args.experts, args.experts_per_tok, args.moe_intermediate, args.vocab = 8, 2, 32, 512
        args.no_save = True
    args.batches = [int(b) for b in args.batches.split(",")]
    args.prefill_lens = [int(n) for n in args.prefill_lens.split(",") if n]
    return args


def run_and_record(script: str, args: argparse.Namespace, run_fn) -> dict:
    """Run `run_fn(args)` and wrap its results with the command, commit, environment, workload
    and wall time; written to `args.out` (and `args.out_dir`) unless `args.no_save`."""
    start = time.perf_counter()
    result = {
        "command": " ".join(["python3", script, *sys.argv[1:]]),
        "commit": git_commit(),
        **environment(args.device),
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "out_dir")},
        "results": run_fn(args),
    }
    result["wall_s"] = time.perf_counter() - start
    print(f"total {result['wall_s']:.1f} s")
    if not args.no_save:
        write_result(Path(args.out), args.out_dir, result)
    return result


def main() -> None:
    args = parse_args()
    if args.smoke:  # fla's kernels need a GPU: let transformers take its PyTorch fallback
        sys.modules["fla"] = None  # type: ignore[assignment]
    run_and_record("bench/gpu_e2e.py", args, run)


if __name__ == "__main__":
    main()
