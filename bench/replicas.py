"""Data-parallel replicas on the CPU with the embedded model: 1 vs 2 replicas, and the
router's prefix hit rate (prefix-aware vs round-robin), in one run.

Workload (system-prompt, as bench/prefix_workloads.py): `--system-prompts` distinct system
prompts of `--system-len` tokens, `--questions` different questions after each (interleaved),
`--concurrency` requests in flight, `--output-len` tokens each (greedy, ignore_eos). Each
phase gets its own prompts (other seeds) so no phase finds another's cache.

    one         1 replica (pinned to one core), prefix router          -> baseline
    prefix      2 replicas (one core each), prefix-aware router        -> throughput ratio
    round_robin the same 2 replicas, round-robin                        -> hit-rate baseline

Throughput = generated tokens / wall seconds through `ReplicaClient` (no HTTP). Hit rate =
hit tokens / queried tokens from the replicas' own prefix-cache counters over the phase;
the JSON gives each as a ratio to the one-replica phase.
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


def prompts(args: argparse.Namespace, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)

    def draw(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    systems = [draw(args.system_len) for _ in range(args.system_prompts)]
    work = [s + draw(args.question_len) for _ in range(args.questions) for s in systems]
    order = torch.randperm(len(work), generator=gen).tolist()  # no replica-aligned pattern
    return [work[i] for i in order]


async def run_phase(client: ReplicaClient, work: list[list[int]], args) -> dict:
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)  # fmt: skip
    before = await replica_counts(client)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(ids: list[int]) -> int:
        async with gate:
            outs = [o async for o in client.generate(ids, params)]
            return len(outs[-1].outputs[0].token_ids)

    start = time.perf_counter()
    generated = sum(await asyncio.gather(*(one(p) for p in work)))
    elapsed = time.perf_counter() - start
    after = await replica_counts(client)
    hit = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queried = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return {
        "requests": len(work), "generated_tokens": generated, "seconds": round(elapsed, 3),
        "tokens_per_s": round(generated / elapsed, 2), "hit_tokens": hit,
        "queried_tokens": queried, "hit_rate": round(hit / queried, 4) if queried else 0.0,
        "decisions": {f"{r}:{why}": n for (r, why), n in sorted(client.router.decisions.items())},
    }  # fmt: skip


async def replica_counts(client: ReplicaClient) -> list[tuple[int, int]]:
    stats = [await a.get_stats.remote() for a in client.actors]
    return [(s.prefix_cache_hit_tokens, s.prefix_cache_queried_tokens) for s in stats]


async def with_client(replicas, policy: str, work, args) -> dict:
    client = ReplicaClient(replicas, RouterConfig(policy=policy))
    try:
        return await run_phase(client, work, args)
    finally:
        await client.detach()


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
            "load_average_1m": os.getloadavg()[0], "python": platform.python_version(),
            "torch": torch.__version__, "ray": __import__("ray").__version__}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-len", type=int, default=600)
    p.add_argument("--question-len", type=int, default=24)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--out", default=str(ROOT / "bench/results/replicas_cpu.json"))
    args = p.parse_args()
    options = {"max_model_len": 4096, "kv_cache_memory": 256 << 20, "max_num_seqs": 16}
    init_ray(num_cpus=2)
    phases = {}
    one = start_replicas(None, options, 1, cores_per_replica=1)  # as each of the two
    vocab = one.info["model_config"].vocab_size
    try:
        phases["one"] = asyncio.run(with_client(one, "prefix", prompts(args, vocab, 1), args))
    finally:
        one.close()
    two = start_replicas(None, options, 2)
    try:
        for seed, policy in ((2, "prefix"), (3, "round_robin")):
            work = prompts(args, vocab, seed)
            phases[policy] = asyncio.run(with_client(two, policy, work, args))
    finally:
        two.close()
    result = {
        "command": " ".join([sys.executable, *sys.argv]), "commit": commit(),
        "hardware": hardware(), "options": options, "workload": vars(args), "phases": phases,
        "throughput_2_vs_1": ratio(phases, "prefix", "one", "tokens_per_s"),
        "hit_rate_prefix_vs_one": ratio(phases, "prefix", "one", "hit_rate"),
        "hit_rate_round_robin_vs_one": ratio(phases, "round_robin", "one", "hit_rate"),
    }  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "hardware"}, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
