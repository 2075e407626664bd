"""Prefix caching: time to first token of a prefix-cache hit vs a cold run, same process.

Workloads (`--workloads`, all by default): `pair` (below), `system-prompt` and `multi-turn`
(bench/prefix_workloads.py: hit rate and TTFT hit vs cold), and `sweep` (hit rate vs checkpoint
memory per stride and keep policy, the basis of the default stride).

A kimi_linear-shaped model ([KDA, KDA, KDA, MLA] x layers/4, random weights, MoE FFNs; tiny by
default) serves, for each repetition, a fresh random shared prefix of `prefix_len` tokens:

    miss:    prefix + suffix A   prefix caching on, nothing cached: computes all, checkpoints
    hit:     prefix + suffix B   right after: blocks + state checkpoint reused, suffix computed
    nocache: prefix + suffix B   an engine with prefix caching off (what the hit replaces)

TTFT = wall seconds from `add_request` to the step that returns the first token (max_tokens=1),
one request in flight. The hit's first token and logprob must equal the nocache run's.

    python3 bench/prefix_cache.py                                   # CPU, 8K prefix, JSON saved
    python3 bench/prefix_cache.py --device cuda --prefix-len 32768 \\
        --out bench/results/prefix_cache_h200.json                  # GPU
    python3 bench/prefix_cache.py --prefix-len 1024 --reps 1 --no-save   # smoke test
    python3 bench/prefix_cache.py --device cuda --model-size 1.5b ...     # gpu_e2e.py's model

`--model-size 1.5b` is bench/gpu_e2e.py's Kimi-Linear shape (12 layers, hidden 2048, 32 experts,
bf16 on a GPU), where a hit saves real compute; the default `tiny` (4 layers, hidden 256) is
bounded by the host, so there it measures a hit's fixed cost. Both engines are warmed as
`LLMEngine.from_path` warms them (`hyla.engine.warmup`, prefix hits included) before anything
is timed. Each row says what the request cost the host (bench/prefix_workloads.py), and
`breakdown` counts one system-prompt hit and its cold twin in full (torch ops, sync sites:
bench/prefix_counts.py; untimed, the counting is slow).

On a GPU the linear layers run fla's chunk kernels (checkpoints inside a chunk: rounds of fla
calls split at the boundaries, `hyla.ops.kda.boundaries`), never the reference ops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from prefix_counts import count_step  # noqa: E402
from prefix_workloads import (  # noqa: E402
    host_work,
    run_multi_turn,
    run_system_prompt,
    sweep,
    system_prompt_prompts,
)
from throughput import git_commit, hardware  # noqa: E402

from hyla.config import EngineConfig  # noqa: E402
from hyla.engine.llm import random_model  # noqa: E402
from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.engine.warmup import warm_up  # noqa: E402
from hyla.models.registry import config_from_hf  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402

FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=1)


def model_config(args: argparse.Namespace):
    if args.model_size == "1.5b":
        return config_from_hf(gpu_e2e_config(args).to_dict()).replace(dtype=args.dtype)
    from transformers import KimiLinearConfig

    pattern = ["linear_attention"] * 3 + ["full_attention"]
    hf = KimiLinearConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden // 2,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=64,
        q_lora_rank=None,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
        num_experts=8,
        num_experts_per_token=2,
        num_shared_experts=1,
        linear_attn_config={"head_dim": 32, "num_heads": 4, "short_conv_kernel_size": 4},
        layer_types=(pattern * args.layers)[: args.layers],
        mlp_layer_types=["dense"] + ["sparse"] * (args.layers - 1),
        max_position_embeddings=max_len(args) + 64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return config_from_hf(hf.to_dict()).replace(dtype=args.dtype)


def gpu_e2e_config(args: argparse.Namespace):
    """bench/gpu_e2e.py's transformers config with its default shape (~1.5B parameters)."""
    from gpu_e2e import hf_config

    shape = argparse.Namespace(
        layers=12, hidden=2048, heads=16, head_dim=128, kv_lora_rank=512, experts=32,
        experts_per_tok=4, moe_intermediate=512, vocab=args.vocab,
        prefill_lens=[max_len(args)], prompt_len=0,
    )  # fmt: skip
    return hf_config(shape)


def build_model(config, args: argparse.Namespace):
    """Seeded random weights drawn on the device (`randomize_weights`' scheme: matrices
    ~ N(0, 1/fan_in), norm weights at unit scale, other vectors ~ N(0, 0.02)): a 1.5B model's
    CPU draw would take longer than the benchmark."""
    from hyla.models.loader import build_empty_model

    model = build_empty_model(config, args.device)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
            elif "norm" in name:
                p.fill_(1.0 - config.norm_offset)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def max_len(args: argparse.Namespace) -> int:
    chat = args.turns * (args.message_len + args.reply_len)
    return max(args.prefix_len + args.suffix_len, args.system_len + args.question_len, chat) + 16


def make_engine(
    model, args: argparse.Namespace, prefix_caching: bool, stride: int | None = None,
    policy: str | None = None,
) -> LLMEngine:  # fmt: skip
    options = dict(
        device=args.device,
        max_model_len=max_len(args),
        max_num_seqs=2,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=prefix_caching,
        state_checkpoint_stride=stride or args.stride,
        prefix_checkpoint_policy=policy or args.policy,
    )
    if args.kv_cache_memory:
        options["kv_cache_memory"] = args.kv_cache_memory
    return LLMEngine(model, None, EngineConfig.from_kwargs(**options))


def ttft(engine: LLMEngine, rid: str, prompt: list[int]) -> tuple[float, object]:
    start = time.perf_counter()
    engine.add_request(rid, prompt, FIRST_TOKEN)
    while True:
        for out in engine.step():
            if out.request_id == rid and out.outputs[0].token_ids:
                elapsed = time.perf_counter() - start
                while engine.has_unfinished_requests():
                    engine.step()
                return elapsed, out


def counted_ttft(engine: LLMEngine, rid: str, prompt: list[int]) -> tuple[float, object, dict]:
    """`ttft` and the request's host work (bench/prefix_workloads.py `host_work`)."""
    saves = engine.get_stats().prefix_cache_checkpoint_saves
    with count_step(ops=False) as counts:
        seconds, out = ttft(engine, rid, prompt)
    return seconds, out, host_work(counts, engine.get_stats().prefix_cache_checkpoint_saves - saves)


def tokens(n: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=gen).tolist()


def run(args: argparse.Namespace) -> dict:
    config = model_config(args)
    if args.model_size == "tiny" and args.dtype == "float32":
        model = random_model(config, seed=args.seed, device=args.device)
    else:
        model = build_model(config, args)
    cached = make_engine(model, args, prefix_caching=True)
    plain = make_engine(model, args, prefix_caching=False)
    for engine in (cached, plain):  # as LLMEngine.from_path does: prefix hits included
        warm_up(engine)
    plan = cached.cache_plan
    print(
        f"state bytes per checkpoint: {plan.bytes_per_slot} ({plan.num_checkpoints} reserved, "
        f"stride {args.stride}, policy {args.policy})",
        flush=True,
    )
    warm = tokens(args.stride + 40, args.vocab, seed=1)
    for i, engine in enumerate((cached, plain, cached)):  # warm-up, including a hit
        ttft(engine, f"warm{i}", warm + [5 + i])
    result = {
        "model": {"size": args.model_size, "dtype": args.dtype,
                  "layer_pattern": list(config.layer_pattern), "hidden": config.hidden_size,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "bytes_per_checkpoint": plan.bytes_per_slot,
                  "bytes_per_block": plan.bytes_per_block},
    }  # fmt: skip
    if "pair" in args.workloads:
        result["pair"] = run_pair(cached, plain, args)
    if "system-prompt" in args.workloads:
        result["system_prompt"] = run_system_prompt(cached, plain, args)
        report("system prompt", result["system_prompt"])
        result["breakdown"] = breakdown(cached, plain, args)
    if "multi-turn" in args.workloads:
        result["multi_turn"] = run_multi_turn(cached, plain, args)
        report("multi-turn", result["multi_turn"])
    if "sweep" in args.workloads:

        def factory(prefix_caching: bool, stride: int, policy: str) -> LLMEngine:
            return make_engine(model, args, prefix_caching, stride, policy)

        result["sweep"] = sweep(factory, args)
    return result


def breakdown(cached: LLMEngine, plain: LLMEngine, args: argparse.Namespace) -> dict:
    """Host work of one more system-prompt question as a hit (`cached`, its prefix cached by
    the workload) and cold (`plain`), counted in full (untimed): torch ops, sync sites."""
    system = system_prompt_prompts(args)[0][: args.system_len]
    prompt = system + tokens(args.question_len, args.vocab, 99)
    result = {}
    for name, engine in (("hit", cached), ("cold", plain)):
        saves = engine.get_stats().prefix_cache_checkpoint_saves
        with count_step() as counts:
            _, out = ttft(engine, f"breakdown-{name}", prompt)
        sites = counts.sync_sites.most_common(12)
        result[name] = {
            "num_cached_tokens": out.num_cached_tokens,
            **counts.summary(),
            **host_work(counts, engine.get_stats().prefix_cache_checkpoint_saves - saves),
            "top_sync_sites": [f"{n} x {site}" for site, n in sites],
        }
        print(f"breakdown {name}: {counts.summary()}", flush=True)
    return result


def report(name: str, summary: dict) -> None:
    hit, cold = summary["median_ttft_hit_s"], summary["median_ttft_cold_s"]
    print(
        f"{name}: hit rate {summary['hit_rate']:.3f}, TTFT hit {hit:.3f} s vs cold {cold:.3f} s"
        f" = {cold / hit:.1f}x, same first tokens {summary['all_first_tokens_equal']}",
        flush=True,
    )


def run_pair(cached: LLMEngine, plain: LLMEngine, args: argparse.Namespace) -> dict:
    rows = []
    for r in range(args.reps):
        prefix = tokens(args.prefix_len, args.vocab, seed=100 + r)
        a = prefix + tokens(args.suffix_len, args.vocab, seed=200 + r)
        b = prefix + tokens(args.suffix_len, args.vocab, seed=300 + r)
        miss_s, _, miss_work = counted_ttft(cached, f"miss{r}", a)
        hit_s, hit, hit_work = counted_ttft(cached, f"hit{r}", b)
        nocache_s, ref, nocache_work = counted_ttft(plain, f"nocache{r}", b)
        same_token = hit.outputs[0].token_ids == ref.outputs[0].token_ids
        dlogprob = abs(hit.outputs[0].cumulative_logprob - ref.outputs[0].cumulative_logprob)
        rows.append(
            dict(
                miss_s=miss_s,
                hit_s=hit_s,
                nocache_s=nocache_s,
                num_cached_tokens=hit.num_cached_tokens,
                same_first_token=same_token,
                first_logprob_abs_diff=dlogprob,
                miss=miss_work,
                hit=hit_work,
                nocache=nocache_work,
            )
        )
        print(
            f"rep {r}: miss {miss_s:.3f} s  hit {hit_s:.3f} s  nocache {nocache_s:.3f} s  "
            f"cached {hit.num_cached_tokens} tokens  same token {same_token}",
            flush=True,
        )
    med = {k: statistics.median(row[k] for row in rows) for k in ("miss_s", "hit_s", "nocache_s")}
    stats = cached.get_stats()
    print(
        f"pair TTFT median: hit {med['hit_s']:.3f} s vs nocache {med['nocache_s']:.3f} s = "
        f"{med['nocache_s'] / med['hit_s']:.1f}x",
        flush=True,
    )
    return {
        "reps": rows,
        "median_ttft_s": med,
        "speedup_hit_vs_nocache": med["nocache_s"] / med["hit_s"],
        "speedup_hit_vs_miss": med["miss_s"] / med["hit_s"],
        "all_first_tokens_equal": all(row["same_first_token"] for row in rows),
        "cache": {
            "num_blocks": cached.cache_plan.num_usable_blocks,
            "block_size": cached.cache_plan.block_size,
            "num_state_checkpoints": cached.cache_plan.num_checkpoints,
            "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--prefix-len", type=int, default=8192)
    p.add_argument("--suffix-len", type=int, default=64)
    p.add_argument("--stride", type=int, default=256, help="state_checkpoint_stride")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-memory", type=int, default=None)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: 1 on the CPU, where more threads only "
        "add noise on a shared machine; torch's default on a GPU)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model-size",
        choices=("tiny", "1.5b"),
        default="tiny",
        help="tiny: --layers/--hidden (host-bound); 1.5b: bench/gpu_e2e.py's shape",
    )
    p.add_argument("--dtype", default=None, help="default: bfloat16 for 1.5b, else float32")
    p.add_argument(
        "--workloads",
        default="pair,system-prompt,multi-turn,sweep",
        help="comma-separated: pair, system-prompt, multi-turn, sweep",
    )
    p.add_argument("--policy", default="all", help="prefix_checkpoint_policy")
    p.add_argument("--system-len", type=int, default=2000)
    p.add_argument("--question-len", type=int, default=48)
    p.add_argument("--questions", type=int, default=64)
    p.add_argument(
        "--cold-samples",
        type=int,
        default=8,
        help="system-prompt questions also run cold (TTFT baseline)",
    )
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--message-len", type=int, default=300)
    p.add_argument("--reply-len", type=int, default=32)
    p.add_argument("--sweep-strides", default="64,128,256,512")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefix_cache_cpu.json"))
    args = p.parse_args()
    args.workloads = args.workloads.split(",")
    args.sweep_strides = [int(x) for x in args.sweep_strides.split(",")]
    if args.dtype is None:
        args.dtype = "bfloat16" if args.model_size == "1.5b" else "float32"
    if args.model_size == "1.5b":
        args.layers, args.hidden = 12, 2048
    if args.threads is None and args.device == "cpu":
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    hw = hardware()
    if args.device.startswith("cuda"):
        hw["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    result = {
        "command": " ".join(["python3", "bench/prefix_cache.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "hardware": hw,
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "no_save")},
        **run(args),
    }
    if not args.no_save:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
