"""One 1M-token prompt on one GPU: chunked prefill then decode through hyla's engine.

A small random-weight KDA + DSA hybrid (["kda", "kda", "kda", "dsa"] x groups, dense FFNs, bf16,
hidden 1024, DSA top-k 2048 with a small lightning indexer) serves a single request of
`--prompt-len` random tokens (default 1,048,576), prefilled in chunks of `--chunk` tokens, then
`--decode-tokens` greedy tokens. Reports TTFT, prefill tokens/s, decode TPOT and
`torch.cuda.max_memory_allocated`; progress and a projected prefill time print every few chunks.
When the projection (chunk time grows with the context) exceeds `--max-prefill-s`, the run stops
early and says so in the JSON instead of running past the device's time limit.

    PYTHONPATH=. python3 bench/gpu_long_context.py --prompt-len 131072   # try smaller first
    PYTHONPATH=. python3 bench/gpu_long_context.py                       # 1M tokens
    PYTHONPATH=. python3 bench/gpu_long_context.py --smoke               # CPU, tiny: a bug check
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_e2e import random_prompts, run_and_record, sync  # noqa: E402

from hyla.cache.spec import bytes_per_state_slot, bytes_per_token  # noqa: E402
from hyla.config import (  # noqa: E402
    DSAConfig,
    EngineConfig,
    LinearAttentionConfig,
    MLAConfig,
    ModelConfig,
)
from hyla.engine.llm import randomize_weights  # noqa: E402
from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.models.loader import build_empty_model  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402


def model_config(args: argparse.Namespace) -> ModelConfig:
    pattern = ("kda", "kda", "kda", "dsa") * args.groups
    return ModelConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        layer_pattern=pattern, ffn_pattern=("dense",) * len(pattern),
        max_context_len=args.prompt_len + args.decode_tokens + 64, dtype=args.dtype,
        bos_token_id=1, eos_token_ids=(2,),
        linear=LinearAttentionConfig(
            num_k_heads=args.heads, num_v_heads=args.heads, head_k_dim=args.head_dim,
            head_v_dim=args.head_dim,
        ),
        mla=MLAConfig(
            num_heads=args.heads, kv_lora_rank=args.kv_lora_rank, qk_nope_head_dim=args.head_dim,
            qk_rope_head_dim=64, v_head_dim=args.head_dim, q_lora_rank=args.q_lora_rank,
            use_rope=False,  # Kimi-style NoPE MLA, like hyla's default model
        ),
        dsa=DSAConfig(
            index_n_heads=args.index_heads, index_head_dim=args.index_head_dim,
            index_topk=args.index_topk,
        ),
    )  # fmt: skip


def random_model(config: ModelConfig, seed: int, device: str):
    """`hyla.engine.llm.random_model`'s initialisation, on parameters allocated the way the
    loader allocates them (config.dtype, on the device)."""
    return randomize_weights(build_empty_model(config, device), seed).eval()


def make_engine(model, args: argparse.Namespace) -> LLMEngine:
    config = model.config
    max_len = args.prompt_len + args.decode_tokens + 16
    budget = bytes_per_token(config) * (max_len + 4 * args.block_size)
    budget += 4 * bytes_per_state_slot(config) + (64 << 20)
    options = dict(
        device=args.device, max_model_len=max_len, max_num_seqs=1,
        max_num_batched_tokens=args.chunk, enable_prefix_caching=False,
        block_size=args.block_size, kv_cache_memory=budget,
    )  # fmt: skip
    return LLMEngine(model, None, EngineConfig.from_kwargs(**options))


def projected_total(elapsed: float, step_times: list[float], done: int, total: int, chunk: int):
    """Prefill seconds when every later chunk costs the last one plus the per-chunk growth seen
    so far (attention over the cache grows linearly with the context)."""
    if len(step_times) < 6:  # the first chunks may still compile kernels: too noisy to judge
        return None
    growth = max((step_times[-1] - step_times[1]) / (len(step_times) - 2), 0.0)
    remaining = (total - done + chunk - 1) // chunk
    return elapsed + sum(step_times[-1] + growth * (j + 1) for j in range(remaining))


def prefill(engine: LLMEngine, prompt: list[int], args: argparse.Namespace) -> dict:
    params = SamplingParams(temperature=0, max_tokens=args.decode_tokens + 1, ignore_eos=True)
    engine.add_request("long", prompt, params)
    n, step_times, done, projection = len(prompt), [], 0, None
    sync(args.device)
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        outs = engine.step()
        sync(args.device)
        step_times.append(time.perf_counter() - t0)
        done = min(done + args.chunk, n)
        elapsed = time.perf_counter() - start
        if any(o.outputs[0].token_ids for o in outs):
            return dict(ttft_s=elapsed, steps=len(step_times), tokens_per_s=n / elapsed,
                        first_chunk_s=step_times[0], last_chunk_s=step_times[-1],
                        aborted=False)  # fmt: skip
        projection = projected_total(elapsed, step_times, done, n, args.chunk)
        if len(step_times) % args.print_every == 0:
            eta = f"  projected TTFT {projection:.0f} s" if projection else ""
            print(f"prefill {done:8d}/{n} tokens  {elapsed:7.1f} s  last chunk "
                  f"{1e3 * step_times[-1]:7.1f} ms{eta}", flush=True)  # fmt: skip
        if projection is not None and projection > args.max_prefill_s:
            engine.abort_request(["long"])
            print(f"stopping: projected TTFT {projection:.0f} s > --max-prefill-s", flush=True)
            return dict(aborted=True, tokens_done=done, elapsed_s=elapsed,
                        projected_ttft_s=projection, steps=len(step_times),
                        last_chunk_s=step_times[-1])  # fmt: skip


def decode(engine: LLMEngine, args: argparse.Namespace) -> dict:
    step_times = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        sync(args.device)
        step_times.append(time.perf_counter() - t0)
    step_times.sort()
    return dict(
        steps=len(step_times),
        tpot_mean_s=sum(step_times) / max(len(step_times), 1),
        tpot_median_s=step_times[len(step_times) // 2] if step_times else None,
    )


def run(args: argparse.Namespace) -> dict:
    config = model_config(args)
    model = random_model(config, args.seed, args.device)
    num_params = sum(p.numel() for p in model.parameters())
    engine = make_engine(model, args)
    print(f"{num_params / 1e6:.0f} M parameters, pattern {config.layer_pattern}; "
          f"{engine.cache_plan.describe()}", flush=True)  # fmt: skip
    # three chunks (and > top-k): the first chunk's kernels and those of chunks that continue a
    # state and a cache (fla compiles both variants), then decode, all before the timed run
    warm_len = min(args.prompt_len, max(3 * args.chunk, 3 * args.index_topk))
    warm = random_prompts(1, warm_len, args.vocab, seed=1)[0]
    engine.add_request("warm", warm, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():  # compiles / autotunes dense, sparse and decode paths
        engine.step()
    prompt = random_prompts(1, args.prompt_len, args.vocab, seed=args.seed + 7)[0]
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    result: dict = dict(model=dict(parameters=num_params, layer_pattern=list(config.layer_pattern),
                                   hidden=args.hidden, index_topk=args.index_topk,
                                   index_heads=args.index_heads,
                                   index_head_dim=args.index_head_dim),
                        cache_bytes=engine.cache_plan.total_bytes)  # fmt: skip
    try:
        result["prefill"] = prefill(engine, prompt, args)
        print(f"prefill: {result['prefill']}", flush=True)
        if not result["prefill"]["aborted"]:
            result["decode"] = decode(engine, args)
            print(f"decode: {result['decode']}", flush=True)
    except torch.OutOfMemoryError as e:
        result["oom"] = str(e).splitlines()[0]
        print(f"OUT OF MEMORY: {result['oom']}", flush=True)
    if args.device.startswith("cuda"):
        result["peak_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_memory_reserved_bytes"] = torch.cuda.max_memory_reserved()
        print(f"peak memory allocated {result['peak_memory_allocated_bytes'] / 2**30:.2f} GiB")
    return result


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt-len", type=int, default=1_048_576)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--chunk", type=int, default=8192, help="prefill chunk (max_num_batched_tokens)")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--max-prefill-s", type=float, default=420.0)
    p.add_argument("--print-every", type=int, default=8)
    p.add_argument("--groups", type=int, default=2, help="repeats of [kda, kda, kda, dsa]")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--kv-lora-rank", type=int, default=512)
    p.add_argument("--q-lora-rank", type=int, default=512)
    p.add_argument("--index-heads", type=int, default=4)
    p.add_argument("--index-head-dim", type=int, default=64)
    p.add_argument("--index-topk", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, fp32: a bug check")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_long_context_h200.json"))
    p.add_argument("--out-dir", default=None, help="also copy the JSON here (e.g. $OUT)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.device, args.dtype, args.prompt_len, args.decode_tokens = "cpu", "float32", 600, 3
        args.chunk, args.block_size, args.print_every, args.groups = 128, 16, 2, 1
        args.hidden, args.intermediate, args.heads, args.head_dim = 64, 128, 2, 16
        args.kv_lora_rank, args.q_lora_rank, args.index_heads = 32, 32, 2
        args.index_head_dim, args.index_topk, args.vocab, args.no_save = 16, 64, 512, True
    return args


def main() -> None:
    result = run_and_record("bench/gpu_long_context.py", parse_args(), run)
    if "oom" in result["results"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
