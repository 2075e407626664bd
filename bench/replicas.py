"""Data-parallel replicas on the CPU with the embedded model: 1 vs 2 replicas, and the
router's prefix hit rate (prefix-aware vs round-robin), in one run.

    system_prompt  `--system-prompts` distinct system prompts of `--system-len` tokens,
                   `--questions` different questions after each, in a shuffled order,
                   `--concurrency` requests in flight
    multi_turn     `--conversations` chats of `--turns` turns, all chats at once: turn k's
                   prompt is turn k-1's prompt + its reply + a new `--message-len` message

Each workload runs in three phases, each on its own prompts (other seeds: no phase finds
another's cache):

    one          1 replica pinned to one core, prefix router        -> the baseline
    prefix       2 replicas, one core each, prefix-aware router     -> throughput, hit rate
    round_robin  the same 2 replicas, round-robin                   -> the hit-rate baseline

Throughput = generated tokens / wall seconds through `ReplicaClient` (no HTTP; greedy,
ignore_eos, `--output-len` tokens). Hit rate = hit tokens / queried tokens from the replicas'
own prefix-cache counters over the phase. The JSON gives the ratios to phase "one" and
`load_average_1m` (this machine is shared: a high load makes the throughput ratio noise).
Writes bench/results/replicas_cpu.json (command, commit, hardware).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from hyla.replicas.client import ReplicaClient
from hyla.replicas.launch import init_ray, start_replicas
from hyla.replicas.router import RouterConfig
from hyla.request import RequestOutputKind, SamplingParams

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"device": "cpu", "max_model_len": 4096, "kv_cache_memory": 256 << 20, "max_num_seqs": 16}


class Draw:
    def __init__(self, vocab: int, seed: int) -> None:
        self.vocab, self.gen = vocab, torch.Generator().manual_seed(seed)

    def __call__(self, n: int) -> list[int]:
        return torch.randint(3, self.vocab, (n,), generator=self.gen).tolist()


async def generate(client: ReplicaClient, ids: list[int], args) -> list[int]:
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)  # fmt: skip
    outs = [o async for o in client.generate(ids, params)]
    return list(outs[-1].outputs[0].token_ids)


async def system_prompt(client: ReplicaClient, draw: Draw, args) -> int:
    systems = [draw(args.system_len) for _ in range(args.system_prompts)]
    work = [s + draw(args.question_len) for _ in range(args.questions) for s in systems]
    order = torch.randperm(len(work), generator=draw.gen).tolist()
    gate = asyncio.Semaphore(args.concurrency)

    async def one(ids: list[int]) -> int:
        async with gate:
            return len(await generate(client, ids, args))

    return sum(await asyncio.gather(*(one(work[i]) for i in order)))


async def multi_turn(client: ReplicaClient, draw: Draw, args) -> int:
    async def chat(prompt: list[int]) -> int:
        generated = 0
        for _ in range(args.turns):
            reply = await generate(client, prompt, args)
            generated += len(reply)
            prompt = prompt + reply + draw(args.message_len)
        return generated

    firsts = [draw(args.message_len * 4) for _ in range(args.conversations)]
    return sum(await asyncio.gather(*(chat(p) for p in firsts)))


WORKLOADS = {"system_prompt": system_prompt, "multi_turn": multi_turn}


async def run_phase(replicas, policy: str, workload: str, seed: int, args) -> dict:
    client = ReplicaClient(replicas, RouterConfig(policy=policy))
    try:
        before = await replica_counts(client)
        start = time.perf_counter()
        generated = await WORKLOADS[workload](client, Draw(replicas.info["model_config"].vocab_size,
                                                           seed), args)  # fmt: skip
        elapsed = time.perf_counter() - start
        after = await replica_counts(client)
        decisions = dict(client.router.decisions)
    finally:
        await client.detach()
    hit = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queried = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return {
        "generated_tokens": generated, "seconds": round(elapsed, 3),
        "tokens_per_s": round(generated / elapsed, 2), "hit_tokens": hit,
        "queried_tokens": queried, "hit_rate": round(hit / queried, 4) if queried else 0.0,
        "decisions": {f"{r}:{why}": n for (r, why), n in sorted(decisions.items())},
        "load_average_1m": os.getloadavg()[0],
    }  # fmt: skip


async def replica_counts(client: ReplicaClient) -> list[tuple[int, int]]:
    stats = [await a.get_stats.remote() for a in client.actors]
    return [(s.prefix_cache_hit_tokens, s.prefix_cache_queried_tokens) for s in stats]


def ratio(phases: dict, a: str, b: str, key: str) -> float:
    return round(phases[a][key] / phases[b][key], 3) if phases[b][key] else 0.0


def commit() -> str | None:
    if os.environ.get("HYLA_COMMIT"):
        return os.environ["HYLA_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def hardware() -> dict:
    cpu = platform.processor()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "torch": torch.__version__,
            "ray": __import__("ray").__version__}  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-len", type=int, default=600)
    p.add_argument("--question-len", type=int, default=24)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--message-len", type=int, default=80)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--out", default=str(ROOT / "bench/results/replicas_cpu.json"))
    return p.parse_args()


def main() -> None:
    args = parse_args()
    init_ray(num_cpus=2)
    phases: dict[str, dict] = {w: {} for w in WORKLOADS}
    seeds = iter(range(100))
    one = start_replicas(None, OPTIONS, 1, cores_per_replica=1)  # as each of the two
    try:
        for w in WORKLOADS:
            phases[w]["one"] = asyncio.run(run_phase(one, "prefix", w, next(seeds), args))
    finally:
        one.close()
    two = start_replicas(None, OPTIONS, 2, cores_per_replica=1)
    try:
        for w in WORKLOADS:
            for policy in ("prefix", "round_robin"):
                phases[w][policy] = asyncio.run(run_phase(two, policy, w, next(seeds), args))
    finally:
        two.close()
    summary = {
        w: {"throughput_2_vs_1": ratio(p, "prefix", "one", "tokens_per_s"),
            "hit_rate_prefix_vs_one": ratio(p, "prefix", "one", "hit_rate"),
            "hit_rate_round_robin_vs_one": ratio(p, "round_robin", "one", "hit_rate")}
        for w, p in phases.items()
    }  # fmt: skip
    result = {"command": " ".join([sys.executable, *sys.argv]), "commit": commit(),
              "hardware": hardware(), "options": OPTIONS, "workload": vars(args),
              "summary": summary, "phases": phases}  # fmt: skip
    print(json.dumps({"summary": summary, "phases": phases}, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
