"""Offline throughput: hyla's engine vs transformers `generate` on the same model, same run.

A kimi_linear-shaped model with random weights (8 layers = [KDA, KDA, KDA, MLA] x 2, hidden
512, MoE FFNs) is saved as an HF checkpoint; transformers runs it from memory and hyla loads the
saved files. Both decode greedily, EOS disabled, `batch` prompts of `prompt_len` random tokens
for `output_len` new tokens each. Throughput = output tokens / wall seconds of the whole
generate call (prefill included), after one small warm-up call each; hyla's wall time is also
split into prefill and decode steps (`hyla.phases`). Both sides run with the same torch intra-op
thread count (`--threads`, else torch's default); hyla's CPU matmuls use oneDNN through
`hyla.ops.linear`, on the same threads.

    python3 bench/throughput.py                      # full run, JSON to bench/results/
    python3 bench/throughput.py --batch 2 --output-len 8 --no-save   # smoke test

The JSON records the command, the commit (read from .git), the hardware and both numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hyla.engine.llm import LLM  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402


def hf_config(args: argparse.Namespace):
    from transformers import KimiLinearConfig

    pattern = ["linear_attention"] * 3 + ["full_attention"]
    return KimiLinearConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden // 2,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        kv_lora_rank=128,
        q_lora_rank=None,
        qk_rope_head_dim=32,
        qk_nope_head_dim=64,
        v_head_dim=64,
        num_experts=16,
        num_experts_per_token=2,
        num_shared_experts=1,
        linear_attn_config={"head_dim": 64, "num_heads": 8, "short_conv_kernel_size": 4},
        layer_types=(pattern * args.layers)[: args.layers],
        mlp_layer_types=["dense"] + ["sparse"] * (args.layers - 1),
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )


def build_checkpoint(args: argparse.Namespace, path: Path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(hf_config(args)).float().eval()
    model.save_pretrained(path, safe_serialization=True)
    model.generation_config.eos_token_id = None
    return model


def time_hf(model, prompts: list[list[int]], output_len: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts)
    kwargs = dict(do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:, :8], max_new_tokens=2, **kwargs)  # warm-up
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=output_len, **kwargs)
        elapsed = time.perf_counter() - start
    return elapsed, out[:, ids.shape[1] :].tolist()


def time_hyla(path: Path, args, prompts: list[list[int]]) -> tuple[float, list[list[int]], dict]:
    llm = LLM(
        str(path),
        dtype="float32",
        max_model_len=args.prompt_len + args.output_len + 16,
        max_num_seqs=args.batch,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    llm.generate([p[:8] for p in prompts[:2]], SamplingParams(temperature=0, max_tokens=2))
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    phases = time_phases(llm.engine.runner)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    plan = llm.engine.cache_plan
    cache = {"num_blocks": plan.num_usable_blocks, "block_size": plan.block_size}
    return elapsed, [o.outputs[0].token_ids for o in outs], {**cache, "phases": phases}


def time_phases(runner) -> dict:
    """Wrap `runner.execute` to add each step's wall time to the returned dict: steps with a
    prompt chunk count as prefill, steps of one token per request as decode."""
    phases = {"prefill_steps": 0, "prefill_s": 0.0, "decode_steps": 0, "decode_s": 0.0}
    execute = runner.execute

    def timed(out, *rest, **kwargs):
        start = time.perf_counter()
        result = execute(out, *rest, **kwargs)
        kind = "decode" if all(n == 1 for n in out.num_scheduled_tokens.values()) else "prefill"
        phases[f"{kind}_steps"] += 1
        phases[f"{kind}_s"] += time.perf_counter() - start
        return result

    runner.execute = timed
    return phases


def git_commit() -> str | None:
    """HEAD's commit read from the .git files (no git command); `HYLA_COMMIT` in the environment
    wins (a lent GPU machine gets the working tree with a stale .git: pass the commit along,
    `HYLA_COMMIT=$(git rev-parse HEAD)` composed where the tree was committed)."""
    if os.environ.get("HYLA_COMMIT"):
        return os.environ["HYLA_COMMIT"]
    git = ROOT / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
    return None


def hardware() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "platform": platform.platform(),
    }


def match_stats(a: list[list[int]], b: list[list[int]]) -> dict:
    """How many sequences are token-identical, and the shortest common prefix."""
    prefix = []
    for x, y in zip(a, b, strict=True):
        diff = [i for i, (s, t) in enumerate(zip(x, y, strict=True)) if s != t]
        prefix.append(diff[0] if diff else len(x))
    same = sum(x == y for x, y in zip(a, b, strict=True))
    return {"identical_sequences": same, "num_sequences": len(a), "min_common_prefix": min(prefix)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "throughput_cpu.json"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(3, args.vocab, (args.batch, args.prompt_len), generator=gen).tolist()
    num_out = args.batch * args.output_len
    result: dict = {
        "command": " ".join(["python3", "bench/throughput.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "hardware": hardware(),
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "no_save")},
    }
    with tempfile.TemporaryDirectory() as tmp:
        hf = build_checkpoint(args, Path(tmp))
        hyla_s, hyla_ids, cache = time_hyla(Path(tmp), args, prompts)
        result["hyla"] = {"seconds": hyla_s, "output_tokens_per_s": num_out / hyla_s, **cache}
        print(f"hyla:         {num_out / hyla_s:8.1f} output tok/s ({hyla_s:.1f} s)", flush=True)
        print(f"  phases:     {cache['phases']}", flush=True)
        if not args.skip_hf:
            hf_s, hf_ids = time_hf(hf, prompts, args.output_len)
            result["transformers"] = {"seconds": hf_s, "output_tokens_per_s": num_out / hf_s}
            result["speedup"] = hf_s / hyla_s
            result["greedy_match"] = match_stats(hyla_ids, hf_ids)
            print(f"transformers: {num_out / hf_s:8.1f} output tok/s ({hf_s:.1f} s)")
            print(f"speedup:      {hf_s / hyla_s:8.2f}x   match: {result['greedy_match']}")
    result["load_average_1m_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if not args.no_save:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
